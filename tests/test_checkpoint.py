"""Checkpoint files: bad JSON is reported with the file and line, not as a bare decoder traceback."""

from pathlib import Path

import pytest

from tablefree.checkpoint.layout import COMPLETE_MARKER, CONFIG_FILE, complete_steps, resolve_checkpoint
from tablefree.checkpoint.model_dir import read_model_config


def test_malformed_config_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / COMPLETE_MARKER).write_text("{}")
    (tmp_path / CONFIG_FILE).write_text('{\n  "model": {,\n}\n')
    with pytest.raises(ValueError, match=rf"{CONFIG_FILE}: malformed JSON .* at line 2"):
        read_model_config(tmp_path)


def test_resolve_checkpoint_takes_the_newest_complete_step(tmp_path: Path) -> None:
    for step, complete in ((1, True), (2, True), (3, False)):
        directory = tmp_path / "checkpoints" / f"step_{step:08d}"
        directory.mkdir(parents=True)
        if complete:
            (directory / COMPLETE_MARKER).write_text("{}")
    assert [p.name for p in complete_steps(tmp_path / "checkpoints")] == ["step_00000001", "step_00000002"]
    assert resolve_checkpoint(tmp_path).name == "step_00000002"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "checkpoints" / "step_00000003")


def test_one_device_resolver_serves_training_loading_and_lm_eval(monkeypatch) -> None:
    import torch

    from tablefree.device import resolve_device
    from tablefree.train.parallelize import init_distributed

    assert resolve_device("cpu") == init_distributed("cpu").device == torch.device("cpu")
    with pytest.raises(ValueError, match="'bogus': not a torch device"):
        resolve_device("bogus")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="cuda:1: CUDA is not available"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="cuda:1: CUDA is not available"):
        init_distributed("cuda:1")
    assert resolve_device("auto") == init_distributed("auto").device == torch.device("cpu")
    assert resolve_device("cuda", fallback_to_cpu=True) == torch.device("cpu")  # the lm-eval adapter's
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", local_rank=3) == torch.device("cuda", 3)  # torchrun's local rank
    assert resolve_device("cuda:1", local_rank=3) == torch.device("cuda", 1)  # an explicit index wins
    assert resolve_device(None) == torch.device("cuda")


def test_staged_directory_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    from tablefree.fileio import staged_directory

    target = tmp_path / "out"
    with pytest.raises(RuntimeError), staged_directory(target) as staging:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("killed half way")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with staged_directory(target) as staging:
        (staging / "whole.txt").write_text("x")
    assert [p.name for p in target.iterdir()] == ["whole.txt"]
