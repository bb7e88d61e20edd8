"""The command line's shared conventions: overrides anywhere, one-line errors, --version, validated printing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tablefree.cli import build_parser, is_override, main, parse_args

REPO_CONFIG = "configs/tiny.yaml"


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # where configs/ is


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """A small prepared dataset: --print-config checks the data it would train on."""
    from train_helpers import make_dataset

    return str(make_dataset(tmp_path_factory.mktemp("data") / "d", vocab_size=96))


def print_config(capsys, *argv: str) -> dict:
    assert main(["train", "--config", REPO_CONFIG, *argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    return yaml.safe_load("\n".join(line for line in out.splitlines() if not line.startswith("#")))


def test_overrides_anywhere_on_the_command_line_apply_in_order(capsys, data_dir) -> None:
    # The command: an override before and after an option.
    config = print_config(
        capsys, f"data.dir={data_dir}", "--run-dir", "R", "optim.lr=1e-3", "seed=4", "seed=5"
    )
    assert config["data"]["dir"] == data_dir and config["optim"]["lr"] == 1e-3 and config["seed"] == 5
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


def test_print_config_validates_before_printing(capsys, data_dir) -> None:
    assert main(["train", "--config", REPO_CONFIG, "model.interface=canonicl", "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown interface 'canonicl'" in captured.err
    config = print_config(capsys, f"data.dir={data_dir}", "model.interface.seed=3", "model.interface=affine")
    assert config["model"]["interface"]["name"] == "affine"
    assert config["model"]["interface"]["seed"] == 3


def test_print_config_checks_every_file_it_will_read(capsys, data_dir, tmp_path) -> None:
    """issue 25.5: `--print-config` exited 0 with a plan on a dataset directory that does not exist."""
    assert main(["train", "--config", REPO_CONFIG, "data.dir=data/mien", "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "data/mien/manifest.json not found" in captured.err
    assert "tablefree data prepare" in captured.err
    # a shard that does not match its manifest, as training would find it
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(data_dir, damaged)
    shard = next(damaged.glob("val_*.bin"))
    shard.write_bytes(shard.read_bytes()[:-8])
    assert main(["train", "--config", REPO_CONFIG, f"data.dir={damaged}", "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and shard.name in captured.err
    # --resume on a run directory with nothing to resume fails as training would
    argv = ["train", "--config", REPO_CONFIG, f"data.dir={data_dir}", "--run-dir", str(tmp_path / "none")]
    assert main([*argv, "--resume", "--print-config"]) == 1
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "none").exists()


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


def test_a_list_typed_with_spaces_names_the_option(capsys) -> None:
    """issue 25: `--seeds 0, 1, 2` blamed an override `1,`."""
    with pytest.raises(SystemExit) as caught:
        main(["compare", "--config", "configs/compare-tiny.yaml", "--seeds", "0,", "1,", "2", "--no-report"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--seeds 0, 1, 2: a comma-separated list takes no spaces; write --seeds 0,1,2" in err
    assert "override" not in err


def test_ctrl_c_in_compare_prints_the_compare_command(capsys, monkeypatch, tmp_path) -> None:
    """issue 25: after Ctrl-C inside compare the first suggestion was the single run's resume command."""
    import tablefree.compare

    def interrupted(config, report=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(tablefree.compare, "run_sweep", interrupted)
    argv = [
        "compare",
        "--config",
        "configs/compare-tiny.yaml",
        "--seeds",
        "0,1",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main([*argv, "train.budget=100k"]) == 130
    out = capsys.readouterr().out
    assert (
        f"tablefree compare --config configs/compare-tiny.yaml --seeds 0,1 --out {tmp_path / 's'} train.budget=100k"
        in out
    )


def test_resume_on_a_sweep_directory_says_it_is_a_sweep(capsys, tmp_path) -> None:
    (tmp_path / "compare.yaml").write_text("name: x\n")
    assert main(["train", "--resume", "--run-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is a sweep directory (compare.yaml)" in err and "tablefree compare" in err


def test_data_prepare_counts_add_up_and_a_rerun_writes_nothing(capsys, tmp_path) -> None:
    """issue 25: `data prepare` printed documents read, train and validation counts that did not add up, and
    `wrote manifest.json` on a re-run that wrote nothing."""
    import json
    import re
    from pydoc_data.topics import topics

    corpus = tmp_path / "topics.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": topics[k]}) + "\n" for k in sorted(topics)), encoding="utf-8"
    )
    argv = ["data", "prepare", str(corpus), "--out", str(tmp_path / "d"), "--vocab-size", "300"]
    argv += ["--val-section-chars", "2000", "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    read = manifest["corpus"]["documents"]
    whole = sum(1 for item in manifest["validation"]["items"] if item["whole"])
    sections = len(manifest["validation"]["items"]) - whole
    assert sections > 0  # the corpus has documents long enough to lend a section
    train_line = next(line for line in out.splitlines() if line.startswith("train: "))
    found = re.search(
        r"the ([\d,]+) of ([\d,]+) documents read not held out whole; .* add (\d+) for", train_line
    )
    not_held, total_read, pieces = (int(number.replace(",", "")) for number in found.groups())
    assert total_read == read and not_held == read - whole
    assert not_held + pieces == manifest["splits"]["train"]["documents"]
    assert f"{whole} documents held out whole and {sections} sections" in out
    assert "wrote " in out
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "already held this dataset, nothing written" in again and "wrote " not in again


def test_each_command_module_adds_the_verbs_listed_for_it_and_help_lists_them_all(capsys) -> None:
    """A command builds the parser of its verb's module alone (COMMAND_MODULES): a verb missing from the list
    would be unreachable by name."""
    import argparse
    import importlib

    from tablefree.cli import COMMAND_MODULES

    for module, verbs in COMMAND_MODULES.items():
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).add_commands(subparsers)
        assert tuple(subparsers.choices) == verbs, module
    every = [verb for verbs in COMMAND_MODULES.values() for verb in verbs]
    assert list(_verbs(build_parser())) == every == list(_verbs(build_parser(["--help"])))
    assert list(_verbs(build_parser(["data", "prepare"]))) == ["tokenizer", "data"]
    assert list(_verbs(build_parser(["dat"]))) == every  # a typo: argparse names every verb it could be
    with pytest.raises(SystemExit):
        main(["dat", "prepare"])
    assert "invalid choice: 'dat' (choose from" in capsys.readouterr().err


def _verbs(parser) -> list[str]:
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_data_prepare_does_not_import_torch(tmp_path) -> None:
    """issue 41: every `data prepare --part` job paid torch's import (through `eval`'s module and the loader)."""
    import json
    import subprocess
    import sys

    from tablefree.data.tokenizer import train_tokenizer_from_texts

    texts = [f"document {i} holds a few words of text, and more words." for i in range(40)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    train_tokenizer_from_texts(texts, 300, tmp_path / "tokenizer.json")
    argv = ["data", "prepare", str(corpus), "--out", str(tmp_path / "d"), "--tokenizer"]
    argv += [
        str(tmp_path / "tokenizer.json"),
        "--workers",
        "1",
        "--no-progress",
        "--split-rule",
        "keyed-hash",
    ]
    for command in (argv, ["data", "verify", str(tmp_path / "d")], [*argv, "--part", "1/1"]):
        if command[-1] == "1/1":
            (tmp_path / "d" / "manifest.json").unlink()
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tablefree.cli", *command],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
        assert "tablefree.data.prepare" in imported or command[1] == "verify"
        assert "torch" not in imported, command
