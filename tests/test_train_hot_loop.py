"""The hot loop's host-device traffic: token ids are checked on the CPU side of the loader (never by reading a
device tensor), batches go to CUDA from pinned memory, and AdamW is fused (CUDA, and plain fp32 CPU parameters)."""

from __future__ import annotations

import pytest
import torch

from tablefree import build_model, preset
from tablefree.interfaces import ids_checked_by_caller
from tablefree.train.optimizer import build_optimizer, fused_adamw_is_safe
from tablefree.train.trainer import device_batch
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
    from tablefree.checkpoint.layout import complete_checkpoints
    from tablefree.train.trainer import train
    from train_helpers import make_dataset

    config = micro_config(make_dataset(tmp_path / "data"), budget="2 steps", checkpoint_format="none")
    summary = train(config, tmp_path / "run")
    assert summary["completed"] and summary["step"] == 2
    assert complete_checkpoints(tmp_path / "run") == []
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_step_never_reads_the_loss_or_norm_and_the_log_reads_them_once_per_interval(
    monkeypatch, tmp_path
) -> None:
    """No host-device wait inside an optimizer step: the loss, the gradient norm and the non-finite flag stay on
    the device (the fused AdamW skips a bad update from the flag itself) and are read once per log interval."""
    from tablefree.train import trainer
    from train_helpers import make_dataset, train_losses

    reads_in_step, batches_read = [], []
    in_step = {"now": False}
    real_step, real_read = trainer.Trainer.train_step, trainer.Trainer.read_steps

    def step(self):
        in_step["now"] = True
        try:
            return real_step(self)
        finally:
            in_step["now"] = False

    def read(self):
        batches_read.append([entry.step for entry in self.state.pending])
        return real_read(self)

    def watch(name):
        original = getattr(torch.Tensor, name)

        def read_value(tensor, *args, **kwargs):
            if in_step["now"] and (tensor.is_floating_point() or tensor.dtype == torch.bool):
                reads_in_step.append(name)  # token ids (int64) are checked on the CPU side by design
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read_value)

    for name in ("item", "tolist", "__bool__", "__float__"):
        watch(name)
    monkeypatch.setattr(trainer.Trainer, "train_step", step)
    monkeypatch.setattr(trainer.Trainer, "read_steps", read)
    run_dir = tmp_path / "run"
    summary = trainer.train(micro_config(make_dataset(tmp_path / "data"), log_every=4), run_dir)
    assert summary["completed"] and summary["step"] == 8
    assert reads_in_step == []
    assert batches_read == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert sorted(train_losses(run_dir)) == [4, 8]


@pytest.mark.parametrize(
    ("sharded", "version", "safe"),
    [
        (True, "2.11.0+cu128", False),  # the GPU machine's torch: FSDP2 would leak host memory every step
        (True, "2.10.1", False),
        (True, "2.12.0", False),
        (True, "2.13.0+cpu", True),
        (True, "2.4.1", True),
        (False, "2.11.0", True),  # plain parameters are not affected
    ],
)
def test_fused_adamw_is_avoided_where_it_leaks_over_dtensors(sharded, version, safe) -> None:
    assert fused_adamw_is_safe(sharded, version) is safe
