"""`compare` on a real SLURM (a one-node cluster on localhost, tests/slurm_cluster.py): 2 interfaces x 2 seeds
submitted as one job array through submitit, one task preempted with SLURM's signal, requeued and resumed;
re-running submits nothing; the report equals that of the same sweep run locally."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from slurm_cluster import ClusterUnavailable, one_node_cluster
from sweep_helpers import config, logged_step, topics_dataset
from tablefree import launch
from tablefree.compare import run_sweep
from tablefree.config_parsing import to_dict
from tablefree.report import build_report
from tablefree.sweep.plan import plan_runs
from tablefree.sweep.status import sweep_status
from tablefree.train import faults


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return topics_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    try:
        with one_node_cluster(tmp_path_factory.mktemp("slurm")) as env:
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            yield env
    except ClusterUnavailable as error:
        pytest.skip(f"no SLURM cluster on this machine: {error}")


def _wait(predicate: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    """Wait for ``predicate``; on timeout raise with ``what()``, the state at that moment."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what())
        time.sleep(0.2)


@pytest.mark.slow
def test_sweep_on_slurm_preempted_requeued_resumed_and_reported_as_locally(
    cluster, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = {"budget": "40 steps"}
    sweep = config(dataset, tmp_path / "cluster", **steps)
    sweep.launch.slurm.executor = "slurm"
    sweep.launch.slurm.cpus_per_task = 1
    plans = plan_runs(sweep)
    sweep_file = tmp_path / "sweep.yaml"  # the same sweep for the command line's --status
    sweep_file.write_text(yaml.safe_dump(to_dict(sweep)))
    # Each task waits after step 3 until its stop signal arrives: sent once a step is logged, a signal could
    # otherwise land after the toy's last step (on a fast machine all its steps take a second or two), where
    # submitit's own handler requeues with no save by the trainer. The jobs take the environment at submission (sbatch exports it), so the local runs below do not hold.
    hold = 3
    monkeypatch.setenv(faults.HOLD_AFTER_STEP_ENV, str(hold))
    outcome = run_sweep(sweep, log=print)
    monkeypatch.delenv(faults.HOLD_AFTER_STEP_ENV)
    assert outcome["report"] is None and sorted(outcome["jobs"]) == sorted(run.name for run in plans)
    jobs = [outcome["jobs"][run.name] for run in plans]
    assert all("_" in job for job in jobs)  # array tasks: ARRAY_TASK

    for run, job in zip(plans, jobs, strict=True):
        _wait(
            lambda run=run: logged_step(run.directory, hold),
            300,
            lambda run=run: f"{run.name}: no step {hold}",
        )
        # The signal goes to the task's job step (JOB.0, submitit's srun), as SLURM's --signal does before a time
        # limit. Signalled as a job, an array task whose array still has pending tasks gets the signal, yet
        # slurmctld 22.05 answers "Job can not be altered now, try again later" and scancel retries for a while:
        # a retry reaching the requeued task while it unpickles, before submitit installs its handler, kills it
        # (exit 140, no requeue), and the run stays interrupted.
        subprocess.run(
            ["scancel", f"--signal={launch.PREEMPT_SIGNAL.name[3:]}", f"{job}.0"], check=True, timeout=60
        )

    _wait(
        lambda: all(e["state"] == "done" for e in sweep_status(sweep, plans).values()),
        600,
        lambda: f"the sweep did not finish: {sweep_status(sweep, plans)}",
    )
    controller_log = (Path(cluster["SLURM_CONF"]).parent / "log" / "slurmctld.log").read_text()
    for run, job in zip(plans, jobs, strict=True):
        assert f"Requeuing JobId={job}(" in controller_log, (
            run.name
        )  # submitit's scontrol requeue, after the save
        logs = "".join(
            p.read_text() for p in sorted((tmp_path / "cluster" / "slurm").rglob(f"{job}_0_log.out"))
        )
        # after the hold's step + 1, or the step itself where the signal came before the hold began
        assert re.search(rf"stopped by SIGUSR2 after step ({hold}|{hold + 1})\b", logs), run.name
        assert "checkpoint saved, requeueing" in logs and "resumed from" in logs, run.name
    target, job = plans[0], jobs[0]
    status = subprocess.run(
        [sys.executable, "-m", "tablefree.cli", "compare", "--config", str(sweep_file), "--status"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "4/4 done, 0 failed" in status and f"{target.name}" in status and job in status
    again = run_sweep(sweep, log=print)  # everything done: nothing is submitted
    assert again["jobs"] == {} and set(again["runs"].values()) == {"done"}

    local = config(dataset, tmp_path / "local", backend="local", **steps)
    run_sweep(local, report=False, log=lambda *_: None)
    on_slurm, here = (
        build_report(tmp_path / "cluster", n_boot=200),
        build_report(tmp_path / "local", n_boot=200),
    )
    for key in ("metrics", "headlines", "baseline", "statistics"):
        assert on_slurm[key] == here[key], key
    for run, reference in zip(plans, plan_runs(local), strict=True):
        evaluated = json.loads((run.directory / "eval.json").read_text())["tasks"]
        assert evaluated == json.loads((reference.directory / "eval.json").read_text())["tasks"], run.name
