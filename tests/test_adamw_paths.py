"""Which AdamW path a run takes and what it costs the hot loop (issue 24): fused where it is safe, foreach over
FSDP2 shards on torch 2.10-2.11 (fused leaks host memory there), the per-tensor loop on 2.12; the run's header
names the path; the non-fused path under ``on_nonfinite: stop`` never reads the non-finite flag inside a step
and still stops at the first bad step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tablefree import build_model, preset
from tablefree.train import optimizer as adamw
from tablefree.train import trainer
from train_helpers import make_dataset, micro_config

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.11.0+cu130", {"fused": False, "foreach": True}),  # the GPU machine's torch
        ("2.10.1", {"fused": False, "foreach": True}),
        ("2.12.0", {"fused": False, "foreach": False}),
        ("2.13.0", {"fused": True}),
    ],
)
def test_the_path_over_dtensor_shards_follows_the_torch_version(version, expected) -> None:
    """Real DTensor parameters (gloo FSDP2, one process); the kernels run on this machine's torch, so the
    DTensorSpec growth seen is this torch's: flat for foreach and (since 2.13) for fused alike."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)]))
    result = subprocess.run(
        [sys.executable, str(TESTS / "adamw_worker.py"), version],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dtensor_params"] > 0
    assert report["implementation"] == expected
    assert report["describe"].startswith(
        "AdamW "
        + ("fused" if expected.get("fused") else "foreach" if expected["foreach"] else "per-tensor loop")
    )
    if not expected.get("fused"):
        assert version.split("+")[0][:4] in report["reason"]
    if torch.__version__ >= "2.13":  # the versions whose fused path is trusted here
        assert report["spec_growth"] <= 2, report


def test_plain_parameters_stay_fused_and_others_take_foreach(monkeypatch) -> None:
    model = build_model(preset("tiny", d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=96))
    monkeypatch.setattr(torch, "__version__", "2.11.0")  # plain tensors are unaffected by the DTensor leak
    assert adamw.adamw_implementation(list(model.parameters()))[0] == {"fused": True}
    model.double()
    implementation, reason = adamw.adamw_implementation(list(model.parameters()))
    assert implementation == {"fused": False, "foreach": True} and "fp32" in reason


def test_the_header_names_the_optimizer_path(tmp_path, capsys) -> None:
    trainer.train(micro_config(make_dataset(tmp_path / "data"), budget="2 steps"), tmp_path / "run")
    header = capsys.readouterr().out
    assert "  optimizer: AdamW fused (one kernel over all tensors" in header
    assert "  threads: " in header


@pytest.fixture
def foreach_path(monkeypatch):
    """The path FSDP2 runs take on torch 2.10-2.11, forced for plain parameters."""
    monkeypatch.setattr(adamw, "fused_adamw_is_safe", lambda sharded, version: False)
    monkeypatch.setattr(adamw, "foreach_grows_over_dtensors", lambda version: False)


def test_the_foreach_path_reads_nothing_inside_a_step(foreach_path, monkeypatch, tmp_path, capsys) -> None:
    """The non-finite flag (a bool tensor) is never read inside a step. (AdamW's foreach path reads its own step
    counts with .item(); off the fused path those live on the CPU, so reading them makes no one wait.)"""
    reads, in_step = [], {"now": False}
    real_step, real_item = trainer.Trainer.train_step, torch.Tensor.item

    def step(self):
        in_step["now"] = True
        try:
            return real_step(self)
        finally:
            in_step["now"] = False

    def item(tensor):
        if in_step["now"] and tensor.dtype == torch.bool:
            reads.append(tensor)
        return real_item(tensor)

    monkeypatch.setattr(trainer.Trainer, "train_step", step)
    monkeypatch.setattr(torch.Tensor, "item", item)
    summary = trainer.train(micro_config(make_dataset(tmp_path / "data"), log_every=4), tmp_path / "run")
    assert summary["completed"] and summary["step"] == 8
    assert reads == []
    assert "optimizer: AdamW foreach (fused AdamW leaks host memory" in capsys.readouterr().out


def test_the_foreach_path_still_stops_at_the_first_non_finite_step(foreach_path, tmp_path) -> None:
    config = micro_config(
        make_dataset(tmp_path / "data"),
        log_every=4,
        checkpoint_every=2,
        **{"optim.lr": 1e6, "schedule.warmup_steps": 0},
    )
    with pytest.raises(trainer.NonFiniteLossError, match="step 3: the gradient norm is nan"):
        trainer.train(config, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "non-finite gradient norm at step 3" and summary["step"] == 2
    from tablefree.checkpoint.layout import complete_checkpoints

    assert [c.name for c in complete_checkpoints(tmp_path / "run")] == ["step_00000002"]


@pytest.mark.slow
def test_validation_does_not_recompile_the_compiled_blocks(tmp_path) -> None:
    """Under no_grad a compiled block fails its grad-mode guard and compiles again (TORCH_LOGS=recompiles showed
    it at every run's final validation); validation runs the blocks eagerly instead, so a run compiles once."""
    from torch._dynamo.utils import counters

    if not hasattr(torch.compiler, "set_stance"):
        pytest.skip("torch < 2.6 has no compiler stance")
    torch._dynamo.reset()
    counters.clear()
    config = micro_config(
        make_dataset(tmp_path / "data"), budget="4 steps", compile="true", val_every=2, precision="fp32"
    )
    summary = trainer.train(config, tmp_path / "run")
    assert summary["compiled"] is True and summary["final_val_loss_estimate"] is not None
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


def test_a_resumed_run_takes_this_process_path_not_the_saved_one(monkeypatch, tmp_path, capsys) -> None:
    """A checkpoint saved on the fused path carries fused=True in its param groups; resumed where fused is not
    safe (FSDP2 on torch 2.10-2.12), the run must take foreach, not the saved flag."""
    data = make_dataset(tmp_path / "data")
    run = tmp_path / "run"
    trainer.train(micro_config(data, budget="4 steps", checkpoint_every=2), run)
    assert "optimizer: AdamW fused" in capsys.readouterr().out
    monkeypatch.setattr(adamw, "fused_adamw_is_safe", lambda sharded, version: False)
    monkeypatch.setattr(adamw, "foreach_grows_over_dtensors", lambda version: False)
    seen = []
    real_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        seen.append({(g["fused"], g["foreach"]) for g in self.param_groups})
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    summary = trainer.train(
        micro_config(data, budget="8 steps", checkpoint_every=2), run, resume=True, allow_change=["budget"]
    )
    assert summary["completed"] and summary["step"] == 8
    assert seen and all(groups == {(False, True)} for groups in seen), seen
    assert "optimizer: AdamW foreach (fused AdamW leaks host memory" in capsys.readouterr().out
