"""Hostile input past the limits that work (issue 43): a zstd bomb held to bounded memory, an input scale no
arithmetic survives, a first step that fails before any update, and a selection split too small to choose a
learning rate on. Each is refused with the field and what works, before the work it would spoil."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sweep_helpers import RECIPE, topics_dataset
from tablefree.data import decoding
from tablefree.data.corpus import Corpus, CorpusError
from tablefree.interfaces.options import MAX_INPUT_SCALE
from train_helpers import make_dataset, micro_config, write_config

zstandard = pytest.importorskip("zstandard")


class RecordingZstandard:
    """The zstandard module as ``_ZstdStream`` uses it, recording the largest output of one decompression
    call: what the stream holds in memory at once, whatever the file expands to."""

    def __init__(self) -> None:
        self.largest = 0

    def ZstdDecompressor(self):
        return self

    def decompressobj(self):
        return _RecordingFrame(zstandard.ZstdDecompressor().decompressobj(), self)


class _RecordingFrame:
    def __init__(self, inner, recorder: RecordingZstandard) -> None:
        self.inner, self.recorder = inner, recorder

    def decompress(self, data) -> bytes:
        out = self.inner.decompress(data)
        self.recorder.largest = max(self.recorder.largest, len(out))
        return out

    @property
    def eof(self) -> bool:
        return self.inner.eof

    @property
    def unused_data(self) -> bytes:
        return self.inner.unused_data


def test_a_zstd_bomb_is_refused_within_bounded_memory_with_the_true_sizes(tmp_path, monkeypatch) -> None:
    """Issue 43: a 64 KB .zst of 2 GB peaked `data scan` at 4.3 GB, because one input block was decompressed
    whole before the expansion was checked. Here 512 MiB of one letter in one frame (16 KB): no decompression
    call returns more than ``zstd_output_bound()`` (about 4 MiB), and the refusal counts the compressed bytes
    actually decompressed, not what was read ahead, so its sizes hold: under the bound's 100 times, plus one
    read block, and far from the whole file."""
    path = tmp_path / "one-letter.txt.zst"
    with path.open("wb") as out, zstandard.ZstdCompressor(level=3).stream_writer(out) as writer:
        block = b"a" * (1 << 20)
        for _ in range(512):
            writer.write(block)
    size = path.stat().st_size
    recorder = RecordingZstandard()
    monkeypatch.setattr(decoding, "_zstandard", lambda source: recorder)
    with pytest.raises(CorpusError) as refused:
        Corpus(path).scan()
    assert 0 < recorder.largest <= decoding.zstd_output_bound() <= 5 << 20
    message = str(refused.value)
    found = re.search(r"\(([\d,]+) bytes out of its first ([\d,]+) compressed bytes, of ([\d,]+)\)", message)
    assert found, message
    expanded, consumed, total = (int(group.replace(",", "")) for group in found.groups())
    assert total == size and 0 < consumed < size // 4
    assert (
        100 * consumed + decoding.EXPANSION_ALLOWANCE < expanded <= 100 * consumed + 3 * decoding.READ_BLOCK
    )


def test_a_multi_frame_zstd_file_fed_in_small_pieces_is_read_whole(tmp_path) -> None:
    """Feeding the decompressor a few bytes at a time keeps frame boundaries: frames of every size, one after
    another (a frame ending mid-piece hands its leftover bytes to the next), read back byte for byte, and a
    truncated last frame is still an error."""
    frames = [b"first line\n" * 3, b"x" * 1000 + b"\n", b"", "third: caf\u00e9\n".encode() * 500]
    data = b"".join(zstandard.ZstdCompressor(level=1).compress(frame) for frame in frames)
    path = tmp_path / "frames.txt.zst"
    path.write_bytes(data)
    assert "".join(Corpus(path).documents()) == b"".join(frames).decode()
    path.write_bytes(data[:-5])
    (junk,) = Corpus(path).scan().junk
    assert junk.kind == "unreadable" and "truncated zstd data: the file ends inside a frame" in junk.detail


@pytest.mark.parametrize("scale", ["inf", "1e308", "nan", "-1", "0", f"{MAX_INPUT_SCALE * 10:g}"])
def test_an_input_scale_outside_the_working_range_is_refused_naming_the_field(tmp_path, scale: str) -> None:
    """Issue 43: model.interface.scale=inf or 1e308 passed every check and the run stopped at step 1. Refused
    when the recipe is read, naming the field and the range that works, before a dataset is even opened."""
    config = write_config(tmp_path / "c.yaml", micro_config(tmp_path / "no-data"))
    command = [
        "train",
        "--config",
        str(config),
        "--run-dir",
        str(tmp_path / "r"),
        "model.interface=canonical",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "tablefree.cli", *command, f"model.interface.scale={scale}", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert "model.interface.scale: expected a positive number up to " in line
    assert f"{MAX_INPUT_SCALE:g}" in line
    assert not (tmp_path / "r").exists()


def test_the_largest_working_scale_is_accepted() -> None:
    from tablefree.interfaces.options import parse_interface_options

    assert parse_interface_options({"name": "affine", "scale": MAX_INPUT_SCALE}).scale == MAX_INPUT_SCALE


def test_a_first_step_that_fails_names_the_settings_not_a_skip(tmp_path) -> None:
    """Issue 43: a non-finite loss at step 1 suggested on_nonfinite=skip, which would skip every update (the
    model is still its initialisation). Weights initialised too large overflow the logits at step 1: the
    error names the settings that size the inputs and weights, says the rate has not acted yet, and says a
    skip would skip everything."""
    from tablefree.train.trainer import NonFiniteLossError, train

    data = make_dataset(tmp_path / "data")
    config = micro_config(data, **{"model.init_std": 1e30, "model.interface": "canonical"})
    with pytest.raises(NonFiniteLossError) as stopped:
        train(config, tmp_path / "run")
    message = str(stopped.value)
    assert message.startswith("step 1: ")
    assert "model.interface.scale=1 (canonical)" in message and "model.init_std=1e+30" in message
    assert "precision=fp32" in message and "optim.lr=0.003 has not acted yet" in message
    assert "on_nonfinite=skip would skip every update" in message
    assert "skips such updates instead" not in message


def grid_sweep(root: Path, select_every: int, data: Path | None = None):
    from tablefree.config_parsing import from_dict
    from tablefree.sweep.config import CompareConfig

    return from_dict(
        CompareConfig,
        {
            "name": "toy",
            "train": {**RECIPE, "data": {"select_every": select_every}},
            "dataset": {"dir": str(data or root / "data")},
            "interfaces": ["learned"],
            "seeds": [0],
            "eval": {"tasks": ["validation"]},
            "grid": {"lr": [1e-3, 2e-3]},
            "out": str(root / "sweep"),
        },
    )


def test_a_selection_split_too_small_to_choose_a_rate_on_is_refused_before_training(tmp_path) -> None:
    """Issue 43: data.select_every at the dataset's largest value held out one window of 128 tokens, and the
    report printed a bold chosen rate. With a rate grid the split must hold at least MIN_SELECTION_WINDOWS
    windows and MIN_SELECTION_TOKENS tokens: refused naming the field, the minimum and the values that
    work."""
    from tablefree.data.loader import TokenLoader
    from tablefree.evaluate.selection import MIN_SELECTION_TOKENS, MIN_SELECTION_WINDOWS
    from tablefree.sweep.plan import check_sweep, plan_runs

    make_dataset(tmp_path / "data", train_tokens=80_000)
    windows = TokenLoader.from_dir(tmp_path / "data", "train", RECIPE["seq_len"], 1).num_chunks
    needed = max(MIN_SELECTION_WINDOWS, MIN_SELECTION_TOKENS // RECIPE["seq_len"])
    largest = windows // needed
    config = grid_sweep(tmp_path, largest)
    check_sweep(config, plan_runs(config))  # the largest k that holds out enough
    for select_every in (largest + 1, windows):
        config = grid_sweep(tmp_path, select_every)
        with pytest.raises(ValueError) as refused:
            check_sweep(config, plan_runs(config))
        message = str(refused.value)
        held = windows // select_every
        assert f"train.data.select_every: {select_every} sets aside {held:,} windows" in message
        assert f"at least {MIN_SELECTION_WINDOWS} windows and {MIN_SELECTION_TOKENS:,} tokens" in message
        assert f"expected 2 to {largest:,}" in message
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_report_on_a_too_small_selection_split_chooses_no_rate(tmp_path) -> None:
    """A sweep from before the check (or one whose split shrank) is flagged in the report: the rates are
    ranked but none is shown as chosen, and the gap at each interface's own rate is left out."""
    from tablefree.compare import run_sweep
    from tablefree.report import build_report

    config = grid_sweep(tmp_path, 8, topics_dataset(tmp_path))  # evaluation needs documents: real text
    config.eval.val_limit = 4
    result = run_sweep(config, log=lambda _: None)
    assert set(result["runs"].values()) == {"done"}
    markdown = (tmp_path / "sweep" / "report.md").read_text()
    assert "too small to choose" not in markdown and "| **" in markdown
    for selection in (tmp_path / "sweep" / "runs").glob(
        "*/*/selection.json"
    ):  # shrink every split to 1 window
        entry = json.loads(selection.read_text())
        selection.write_text(json.dumps({**entry, "windows": 1, "tokens": RECIPE["seq_len"]}))
    report = build_report(tmp_path / "sweep")
    (check,) = report["statistics"]["learning_rate"]
    assert "1 windows, fewer than 32" in check["selection"]["too_small"]
    markdown = (tmp_path / "sweep" / "report.md").read_text()
    assert "**The selection split is too small to choose a rate on**: 1 windows, fewer than 32" in markdown
    assert "not chosen" in markdown and "each interface at its own chosen rate" not in markdown
