"""The command line's shared conventions: overrides anywhere, one-line errors, --version, validated printing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tablefree.cli import build_parser, is_override, main, parse_args

REPO_CONFIG = "configs/tiny.yaml"


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # where configs/ is


def print_config(capsys, *argv: str) -> dict:
    assert main(["train", "--config", REPO_CONFIG, *argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    return yaml.safe_load("\n".join(line for line in out.splitlines() if not line.startswith("#")))


def test_overrides_anywhere_on_the_command_line_apply_in_order(capsys) -> None:
    # The command: an override before and after an option.
    config = print_config(capsys, "data.dir=D", "--run-dir", "R", "optim.lr=1e-3", "seed=4", "seed=5")
    assert config["data"]["dir"] == "D" and config["optim"]["lr"] == 1e-3 and config["seed"] == 5
    args = parse_args(build_parser(), ["train", "a=1", "--run-dir", "R", "b=2", "--resume", "c=3", "a=4"])
    assert args.overrides == ["a=1", "b=2", "c=3", "a=4"] and args.resume
    args = parse_args(build_parser(), ["compare", "--config", "x.yaml", "a=1", "--seeds", "0,1", "b=2"])
    assert args.overrides == ["a=1", "b=2"] and args.seeds == [0, 1]


def test_unknown_arguments_are_still_refused(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["train", "--config", REPO_CONFIG, "a=1", "--bogus", "b=2"])
    assert caught.value.code == 2
    assert "tablefree train: error: unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a verb without overrides takes no KEY=VALUE
        main(["params", "--preset", "tiny", "d_model=64"])
    assert "unrecognized arguments: d_model=64" in capsys.readouterr().err
    assert is_override("optim.lr=1e-3") and not is_override("--x=1") and not is_override("path")


def test_print_config_validates_before_printing(capsys) -> None:
    assert main(["train", "--config", REPO_CONFIG, "model.interface=canonicl", "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown interface 'canonicl'" in captured.err
    config = print_config(capsys, "model.interface.seed=3", "model.interface=affine")
    assert config["model"]["interface"]["name"] == "affine"
    assert config["model"]["interface"]["seed"] == 3


def test_a_command_line_typo_is_not_blamed_on_the_file(capsys) -> None:
    assert main(["train", "--config", REPO_CONFIG, "optim.lrr=3", "--print-config"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tablefree train: error: command-line override 'optim.lrr=3'")
    assert "configs/tiny.yaml.optim" not in err and len(err.splitlines()) == 1


def test_version(capsys) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"tablefree {version('tablefree')}"
