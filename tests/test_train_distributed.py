"""torchrun with 2 processes on CPU (gloo): DDP and FSDP2 follow the single-process loss trajectory for the same
global batch, and checkpoints move between world sizes (2 processes -> 1 and 1 -> 2); sharded (DCP) checkpoints
resume bit-exactly and load for evaluation in one process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tablefree.checkpoint import layout
from tablefree.checkpoint.layout import MODEL_FILE, SHARDED_DIR, is_sharded
from tablefree.checkpoint.model_dir import consolidate, load_model
from tablefree.train.faults import KILL_AFTER_STEP_ENV
from train_helpers import cli_env, make_dataset, micro_config, train_losses, write_config

pytestmark = pytest.mark.slow

STEPS = 8
# Same global batch, different reduction order: equal to fp32 rounding, compounded over a few Adam steps.
TOLERANCE = dict(rel=1e-5, abs=1e-5)


def command(config_path, run_dir, processes: int, *extra: str) -> list[str]:
    launcher = [sys.executable, "-m", "tablefree.cli"]
    if processes > 1:
        launcher = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--standalone", "-m", "tablefree.cli",
        ]  # fmt: skip
    return [*launcher, "train", "--config", str(config_path), "--run-dir", str(run_dir), *extra]


def run(
    config_path, run_dir, processes: int, *extra: str, kill_after: int = 0
) -> subprocess.CompletedProcess:
    env = cli_env()
    if kill_after:
        env[KILL_AFTER_STEP_ENV] = str(kill_after)
    result = subprocess.run(
        command(config_path, run_dir, processes, *extra), env=env, capture_output=True, text=True, timeout=240
    )
    if kill_after:
        assert result.returncode != 0, result.stdout
        assert layout.latest_checkpoint(run_dir).name == "step_00000004"
    else:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    data_dir = make_dataset(root / "data")
    # micro_batch 2: one process accumulates 4 micro-steps, two processes 2 each; 8 sequences per step
    config = micro_config(data_dir, budget=f"{STEPS} steps", micro_batch=2, checkpoint_every=4)
    config_path = write_config(root / "config.yaml", config)
    run(config_path, root / "reference", 1)
    return config_path, train_losses(root / "reference")


def assert_matches(losses: dict[int, float], reference: dict[int, float]) -> None:
    assert list(losses) == list(reference)
    for step, loss in losses.items():
        assert loss == pytest.approx(reference[step], **TOLERANCE), f"step {step}"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one_and_their_checkpoint_resumes_in_one(setup, tmp_path, parallel) -> None:
    config_path, reference = setup
    run_dir = tmp_path / "run"
    run(config_path, run_dir, 2, f"parallel={parallel}", kill_after=6)
    assert_matches(train_losses(run_dir), {s: reference[s] for s in range(1, 7)})
    resumed = run(config_path, run_dir, 1, "--resume")
    assert "resumed from" in resumed.stdout
    assert_matches(train_losses(run_dir), reference)


def test_one_process_checkpoint_resumes_in_two(setup, tmp_path) -> None:
    config_path, reference = setup
    run_dir = tmp_path / "run"
    run(config_path, run_dir, 1, kill_after=6)
    run(config_path, run_dir, 2, "parallel=fsdp", "--resume")
    assert_matches(train_losses(run_dir), reference)
    assert (run_dir / "summary.json").exists()


def test_sharded_checkpoints_resume_two_to_two_bit_exact_and_load_in_one_process(setup, tmp_path) -> None:
    """FSDP2 with checkpoint_format=sharded: each rank writes its own DCP shards (no model.safetensors), a kill
    and a resume on 2 processes reproduce the uninterrupted run bit for bit, and the checkpoint loads in one
    process for eval/export (load_model) and consolidates to the usual single file."""
    config_path, _ = setup
    full = tmp_path / "full"
    run(config_path, full, 2, "parallel=fsdp", "checkpoint_format=full")
    sharded = tmp_path / "sharded"
    run(config_path, sharded, 2, "parallel=fsdp", "checkpoint_format=sharded", kill_after=6)
    step4 = layout.latest_checkpoint(sharded)
    assert is_sharded(step4) and not (step4 / MODEL_FILE).exists()
    assert sorted(p.name for p in (step4 / SHARDED_DIR).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    resumed = run(config_path, sharded, 2, "parallel=fsdp", "checkpoint_format=sharded", "--resume")
    assert "resumed from" in resumed.stdout
    assert train_losses(sharded) == train_losses(full)  # exact, not approximately

    expected = load_model(full)[0].state_dict()
    final = layout.latest_checkpoint(sharded)
    for weights in (load_model(sharded)[0].state_dict(), load_file(str(consolidate(final)))):
        assert sorted(weights) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(weights[name], tensor), name


def test_a_sharded_checkpoint_resumes_in_one_plain_process(setup, tmp_path) -> None:
    """DCP reshards on load: 2 FSDP2 processes -> 1 plain process (no process group, no FSDP) follows the
    reference trajectory, and its final checkpoint is a full one."""
    config_path, reference = setup
    run_dir = tmp_path / "run"
    run(config_path, run_dir, 2, "parallel=fsdp", "checkpoint_format=sharded", kill_after=6)
    run(config_path, run_dir, 1, "parallel=ddp", "--resume")
    assert_matches(train_losses(run_dir), reference)
    final = layout.latest_checkpoint(run_dir)
    assert (final / MODEL_FILE).exists() and not is_sharded(final)


def test_fsdp_skips_a_nan_update_on_the_device_and_stops_at_the_next_read(setup, tmp_path) -> None:
    """The GPU path on gloo: FSDP2's sharded parameters with the fused AdamW, the non-finite flag passed as
    found_inf, read three steps late (log_every 4); the run stops naming step 3 and saves nothing after step 2."""
    config_path, _ = setup
    run_dir = tmp_path / "run"
    overrides = (
        "parallel=fsdp",
        "log_every=4",
        "checkpoint_every=2",
        "optim.lr=1e6",
        "schedule.warmup_steps=0",
    )
    result = subprocess.run(
        command(config_path, run_dir, 2, *overrides),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode != 0
    assert "step 3: the gradient norm is nan" in result.stdout + result.stderr
    assert [c.name for c in layout.complete_checkpoints(run_dir)] == ["step_00000002"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "non-finite gradient norm at step 3" and summary["step"] == 2
