"""The kill loop: training killed with SIGKILL at random moments, some of them half way through writing a
checkpoint, and resumed each time, ends with exactly the weights and losses of an uninterrupted run."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from tablefree.checkpoint import layout, training
from train_helpers import cli_env, make_dataset, micro_config, train_command, train_losses, write_config

pytestmark = pytest.mark.slow
STEPS = 12
RANDOM_KILLS = 4


def metrics_lines(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_at_a_random_moment(config_path, run_dir, rng: random.Random) -> int | None:
    """Start a (resumed) run, wait until it has trained a step, SIGKILL it a random moment later; returns its
    exit status (None when it was killed)."""
    before = metrics_lines(run_dir)
    process = subprocess.Popen(
        train_command(config_path, run_dir, "--resume-if-present"),
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while metrics_lines(run_dir) <= before and process.poll() is None:
        assert time.monotonic() < deadline, "training never reached a step"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.4))  # a step takes ~0.1 s, its checkpoint write about as long
    if process.poll() is not None:
        assert process.returncode == 0, process.stderr.read()
        return 0
    process.send_signal(signal.SIGKILL)
    process.wait()
    return None


def test_random_kills_including_during_checkpoint_writes_end_in_the_uninterrupted_run(tmp_path) -> None:
    data_dir = make_dataset(tmp_path / "data")
    config = micro_config(data_dir, budget=f"{STEPS} steps", checkpoint_every=1, keep_last=2, val_every=4)
    config_path = write_config(tmp_path / "config.yaml", config)
    reference = tmp_path / "reference"
    subprocess.run(train_command(config_path, reference), env=cli_env(), check=True, capture_output=True)

    run_dir = tmp_path / "run"
    # a kill certainly inside a checkpoint write: model files written, train state and COMPLETE not yet
    env = cli_env()
    env[training.KILL_DURING_SAVE_ENV] = "3"
    killed = subprocess.run(train_command(config_path, run_dir), env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (run_dir / "checkpoints" / ".step_00000003.tmp" / "model.safetensors").exists()
    assert layout.latest_checkpoint(run_dir).name == "step_00000002"

    rng = random.Random(12)
    kills, half_written = 1, 1
    while kills < 1 + RANDOM_KILLS:
        if kill_at_a_random_moment(config_path, run_dir, rng) == 0:
            break  # finished before the kill came
        kills += 1
        half_written += any((run_dir / "checkpoints").glob(".step_*"))
    finished = subprocess.run(
        train_command(config_path, run_dir, "--resume-if-present"),
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stderr
    print(f"kills: {kills}, of which left a checkpoint half written: {half_written}")

    assert train_losses(run_dir) == train_losses(reference)  # floats from JSON: equal means bit for bit
    final = layout.latest_checkpoint(run_dir)
    assert final.name == f"step_{STEPS:08d}"
    ours = load_file(str(final / "model.safetensors"))
    theirs = load_file(str(layout.latest_checkpoint(reference) / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000011", "step_00000012"]
