"""The hot loop's host-device traffic: token ids are checked on the CPU side of the loader (never by reading a
device tensor), batches go to CUDA from pinned memory, and AdamW is fused (CUDA, and plain fp32 CPU parameters)."""

from __future__ import annotations

import pytest
import torch

from tablefree import build_model, preset
from tablefree.interfaces import ids_checked_by_caller
from tablefree.train.trainer import build_optimizer, device_batch
from train_helpers import micro_config


def test_batches_are_checked_on_the_cpu_before_they_move(monkeypatch) -> None:
    inputs = torch.tensor([[1, 2, 3]])
    targets = torch.tensor([[2, 3, 96]])  # 96 is outside [0, 96)
    moved = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: moved.append(self) or self)
    with pytest.raises(ValueError, match=r"token id 96 is outside \[0, 96\)"):
        device_batch((inputs, targets), torch.device("cpu"), vocab_size=96)
    assert moved == []  # nothing was copied to the device before the check


def test_a_good_batch_arrives_unchanged() -> None:
    inputs, targets = torch.tensor([[0, 5, 95]]), torch.tensor([[5, 95, 0]])
    got_inputs, got_targets = device_batch((inputs, targets), torch.device("cpu"), vocab_size=96)
    assert torch.equal(got_inputs, inputs) and torch.equal(got_targets, targets)


def test_adamw_is_fused_for_plain_parameters(tmp_path) -> None:
    model = build_model(preset("tiny", d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=96))
    optimizer = build_optimizer(model, micro_config(tmp_path))
    assert optimizer.defaults["fused"] is True  # CPU fused AdamW (torch >= 2.4): 4x faster than per-tensor
    model.double()  # fused wants fp32 parameters here: anything else keeps the default implementation
    assert build_optimizer(model, micro_config(tmp_path)).defaults["fused"] is False
    model.float()
    if torch.cuda.is_available():
        optimizer = build_optimizer(model.cuda(), micro_config(tmp_path))
        assert optimizer.defaults["fused"] is True


def test_the_model_skips_its_own_id_check_only_inside_ids_checked_by_caller() -> None:
    model = build_model(preset("tiny", d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=96))
    bad = torch.tensor([[1, 96]])
    with pytest.raises(ValueError, match="token id 96"):
        model(bad)
    reads = []
    original = torch.Tensor.max
    with ids_checked_by_caller():  # the trainer's forward: no min/max read of the ids
        torch.Tensor.max = lambda self, *a, **k: reads.append(self) or original(self, *a, **k)
        try:
            model(torch.tensor([[1, 95]]))
        finally:
            torch.Tensor.max = original
    assert not [t for t in reads if t.dtype == torch.int64]
    with pytest.raises(ValueError, match="token id 96"):  # and the check is back outside
        model(bad)


def test_checkpoint_format_none_writes_no_checkpoint(tmp_path) -> None:
    """What the GPU benchmark uses: a 1.7B checkpoint would be 21 GB and a minute of a lent machine."""
    from tablefree.train.checkpoints import complete_checkpoints
    from tablefree.train.trainer import train
    from train_helpers import make_dataset

    config = micro_config(make_dataset(tmp_path / "data"), budget="2 steps", checkpoint_format="none")
    summary = train(config, tmp_path / "run")
    assert summary["completed"] and summary["step"] == 2
    assert complete_checkpoints(tmp_path / "run") == []
    assert not (tmp_path / "run" / "checkpoints").exists()
