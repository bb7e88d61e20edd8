"""The README's commands are the ones that work: its first-hour block runs as written, in order, on a fresh
directory with nothing but the checkout's configs (at tiny size, through extra overrides), and every other
``tablefree`` command it shows parses with the current command line."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tablefree.cli import build_parser, main, parse_args

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FIRST_HOUR = "## Your first hour"

# Appended to the README's own commands so the chain runs in seconds; the commands are otherwise unchanged.
# (Overrides and repeated options may come last: the later value wins.)
TINY = {
    ("tokenizer", "train"): ["--vocab-size", "512"],
    ("data", "prepare"): ["--no-progress", "--workers", "1", "--vocab-size", "512"],
    ("train",): [
        "budget=4096",
        "batch_tokens=1024",
        "micro_batch=2",
        "schedule.warmup_steps=1",
        "val_batches=2",
    ],
    ("eval",): ["--limit", "4"],
    ("generate",): ["--max-new-tokens", "8"],
}


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def first_hour_block() -> str:
    text = README.read_text(encoding="utf-8")
    assert FIRST_HOUR in text, f"README.md lost its {FIRST_HOUR!r} section"
    return bash_blocks(text[text.index(FIRST_HOUR) :])[0]


def tablefree_argv(argv: list[str]) -> list[str] | None:
    """The arguments after ``tablefree`` (or ``-m tablefree.cli``), or None for other programs."""
    for marker in ("tablefree", "tablefree.cli"):
        if marker in argv:
            return argv[argv.index(marker) + 1 :]
    return None


def with_tiny_sizes(argv: list[str]) -> list[str]:
    for verbs, extra in TINY.items():
        if tuple(argv[: len(verbs)]) == verbs:
            return argv + extra
    return argv


def test_every_readme_command_parses() -> None:
    checked = 0
    for block in bash_blocks(README.read_text(encoding="utf-8")):
        for argv in commands(block):
            args = tablefree_argv(argv)
            if args is None or args[:1] == ["lm-eval"]:  # lm-eval's own arguments go to lm-eval
                continue
            args = [arg for arg in args if not re.fullmatch(r"\[.*\]", arg)]  # [--optional] placeholders
            args = [arg for arg in args if not arg.startswith("[") and not arg.endswith("]")]
            try:
                parse_args(build_parser(), args)
            except SystemExit as error:
                pytest.fail(f"README command does not parse (exit {error.code}): {shlex.join(argv)}")
            checked += 1
    assert checked >= 20  # the README shows many commands; a broken extraction finds none


def test_first_hour_block_makes_everything_it_promises() -> None:
    verbs = [tuple(argv[1:3]) for argv in commands(first_hour_block())]
    assert [argv[0] for argv in commands(first_hour_block())] == ["tablefree"] * len(verbs)
    for verb in ["data", "train", "eval", "export", "generate"]:
        assert any(v[0] == verb for v in verbs), f"the first-hour block has no `tablefree {verb}`"


@pytest.mark.slow
def test_first_hour_commands_chain_on_a_fresh_directory(tmp_path, monkeypatch, capsys) -> None:
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # a fresh checkout: configs, nothing built
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TABLEFREE_EVAL_DATA", str(tmp_path / "no-eval-data"))  # nothing from this machine
    outputs = []
    for argv in commands(first_hour_block()):
        args = with_tiny_sizes(tablefree_argv(argv))
        code = main(args)
        captured = capsys.readouterr()
        assert code == 0, f"`{shlex.join(args)}` exited {code}:\n{captured.err}"
        outputs.append(captured.out)
    manifest = json.loads((tmp_path / "data/mine/manifest.json").read_text())
    assert manifest["vocab_size"] == 512
    summary = json.loads((tmp_path / "runs/canonical/summary.json").read_text())
    assert summary["completed"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "validation" in json.dumps(results)
    assert (tmp_path / "exported/canonical/config.json").is_file()
    generated = outputs[-1]
    prompt = shlex.split(first_hour_block().splitlines()[-1], comments=True)
    prompt = prompt[prompt.index("--prompt") + 1]
    assert generated.startswith(prompt) and len(generated) > len(prompt) + 1
