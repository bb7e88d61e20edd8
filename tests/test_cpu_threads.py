"""CPU threading chosen at the command line's start (tablefree.cpu_threads, issue 24): OMP_WAIT_POLICY=PASSIVE is
in the environment before torch loads OpenMP, a user's own setting wins, and a run says which it got."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tablefree import cpu_threads

SRC = Path(__file__).resolve().parents[1] / "src"


def hardware_report(tmp_path: Path, program: str = "", **env: str) -> dict:
    """``tablefree hardware --json`` in a fresh process, started as the entry point does (after ``program``)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", cpu_threads.CHOSEN_BY_ENV)}
    environ.update(PYTHONPATH=str(SRC), TABLEFREE_PEAK_FLOPS_CACHE=str(tmp_path / "peak.json"), **env)
    code = f"{program}import sys; from tablefree.cli import main; sys.exit(main(['hardware', '--device', 'cpu', '--json']))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)["threading"]


def test_the_entry_point_does_not_load_torch_before_choosing() -> None:
    code = "import sys, tablefree.cli, tablefree; assert 'torch' not in sys.modules, 'torch loaded on import'"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_the_command_line_sets_a_passive_wait_policy_unless_the_user_set_one(tmp_path) -> None:
    chosen = hardware_report(tmp_path)
    assert chosen["wait_policy"] == "PASSIVE" and chosen["wait_policy_from"].startswith("set by tablefree")
    yours = hardware_report(tmp_path, OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1")
    assert yours["wait_policy"] == "ACTIVE" and yours["wait_policy_from"].startswith("yours")
    assert yours["threads"] == 1 and yours["threads_from"] == "OMP_NUM_THREADS=1"
    late = hardware_report(tmp_path, program="import torch; ")  # a Python caller that loaded torch first
    assert late["wait_policy"] is None and "torch was loaded before" in late["wait_policy_from"]


def test_choose_wait_policy_keeps_a_setting_and_marks_its_own() -> None:
    environ = {"OMP_WAIT_POLICY": "active"}
    assert cpu_threads.choose_wait_policy(environ) == "active" and cpu_threads.CHOSEN_BY_ENV not in environ
    environ = {}
    assert cpu_threads.choose_wait_policy(environ) == "PASSIVE"
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE", cpu_threads.CHOSEN_BY_ENV: "PASSIVE"}
