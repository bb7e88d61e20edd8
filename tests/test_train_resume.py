"""Exact resume after a real ``kill -9``, and a clean save-and-exit on SIGTERM, with training subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tablefree.checkpoint import layout, training
from tablefree.train.faults import KILL_AFTER_STEP_ENV
from train_helpers import cli_env, make_dataset, micro_config, train_command, train_losses, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    data_dir = make_dataset(root / "data")
    config = micro_config(data_dir, budget="10 steps", checkpoint_every=4, val_every=5)
    return write_config(root / "config.yaml", config)


def test_kill_9_then_resume_reproduces_every_loss_bit_for_bit(config_path, tmp_path) -> None:
    reference = tmp_path / "reference"
    subprocess.run(train_command(config_path, reference), env=cli_env(), check=True, capture_output=True)

    interrupted = tmp_path / "interrupted"
    env = cli_env()
    env[KILL_AFTER_STEP_ENV] = "6"  # two steps past the step-4 checkpoint
    killed = subprocess.run(train_command(config_path, interrupted), env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert max(train_losses(interrupted)) == 6
    assert layout.latest_checkpoint(interrupted).name == "step_00000004"
    assert not (interrupted / "summary.json").exists()

    resumed = subprocess.run(
        train_command(config_path, interrupted, "--resume"), env=cli_env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "step 4" in resumed.stdout
    expected, actual = train_losses(reference), train_losses(interrupted)
    assert list(actual) == list(range(1, 11))
    assert actual == expected  # floats from JSON: equal means bit for bit
    val = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    val_resumed = [json.loads(line) for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    estimates = [r["val_loss_estimate"] for r in val if "val_loss_estimate" in r]
    assert len(estimates) == 2  # at step 5 and at the end
    assert estimates == [r["val_loss_estimate"] for r in val_resumed if "val_loss_estimate" in r]
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["completed"] and summary["tokens_seen"] == 10 * 256


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(config_path, tmp_path) -> None:
    run_dir = tmp_path / "run"
    command = train_command(config_path, run_dir, "budget=100000 steps", "checkpoint_every=0")
    process = subprocess.Popen(
        command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "training never reached step 2"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "stopped by SIGTERM" in stdout
    last_step = max(train_losses(run_dir))
    checkpoint = layout.latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == f"step_{last_step:08d}"
    assert training.load_train_state(checkpoint)["step"] == last_step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["completed"] and summary["stop_reason"] == "stopped by SIGTERM"
    assert summary["step"] == last_step < 100_000
