"""A sweep on a cluster: submitit's local executor runs the per-run unit (preempted, requeued, resumed); the
plain sbatch script; the configuration's checks. tests/test_slurm_cluster.py runs the same on a real SLURM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sweep_helpers import config, logged_step, topics_dataset
from tablefree import launch
from tablefree.compare import CompareConfig, run_sweep
from tablefree.config_parsing import from_dict
from tablefree.sweep.plan import plan_runs
from tablefree.sweep.slurm import emit_sbatch
from tablefree.sweep.status import sweep_status
from tablefree.train import faults


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return topics_dataset(tmp_path_factory.mktemp("data"))


def test_launch_config_is_checked() -> None:
    with pytest.raises(ValueError, match=r"launch.backend: expected local or slurm, got 'pbs'"):
        from_dict(CompareConfig, {"launch": {"backend": "pbs"}})
    with pytest.raises(ValueError, match=r"launch.slurm.nodes > 1 needs launch.nproc_per_node >= 1"):
        from_dict(CompareConfig, {"launch": {"backend": "slurm", "slurm": {"nodes": 2}}})
    with pytest.raises(ValueError, match=r"launch.slurm.executor: expected one of"):
        from_dict(CompareConfig, {"launch": {"slurm": {"executor": "cloud"}}})


def test_emit_sbatch_writes_one_line_per_unfinished_run(dataset: Path, tmp_path: Path) -> None:
    sweep = config(dataset, tmp_path / "sweep")
    sweep.launch.slurm.partition = "gpu"
    sweep.launch.slurm.sbatch = {"constraint": "a100", "exclusive": True}
    script_path = tmp_path / "sweep.sbatch"
    emit_sbatch(sweep, script_path, log=lambda *_: None)
    script = script_path.read_text()
    subprocess.run(["bash", "-n", str(script_path)], check=True)  # valid bash
    assert os.access(script_path, os.X_OK)
    options = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for expected in (
        "--array=0-3%4",
        "--signal=USR2@30",
        "--requeue",
        "--partition=gpu",
        "--ntasks-per-node=1",
    ):
        assert f"#SBATCH {expected}" in options
    assert "#SBATCH --constraint=a100" in options and "#SBATCH --exclusive" in options
    runs = script.split("RUNS=(\n")[1].split("\n)")[0].splitlines()
    names = [run.name for run in plan_runs(sweep)]
    assert len(runs) == 4
    for line, name in zip(runs, names, strict=True):
        assert line.strip().strip("'").endswith(f"--no-report --only {name}")
    # the tasks load the resolved config: the same runs, with the local backend inside the job
    resolved = tmp_path / "sweep" / "slurm" / "sweep.yaml"
    assert f"--config {resolved}" in runs[0]
    from tablefree.compare import load_compare_config

    inside = load_compare_config(resolved)
    assert inside.launch.backend == "local"
    assert [run.name for run in plan_runs(inside)] == names
    assert f"-eq {launch.REQUEUE_EXIT_CODE} ]; then" in script and "scontrol requeue" in script
    # run from where the command ran; no time limit the config did not ask for
    assert f"#SBATCH --chdir={Path.cwd()}" in options
    assert not any(line.startswith("#SBATCH --time") for line in options)


def test_emit_sbatch_puts_branches_after_their_trunks(dataset: Path, tmp_path: Path) -> None:
    """A branched budget grid: the trunks' array first, the branches in a second script submitted per trunk
    (--dependency=afterok on that trunk's task), and the resources and time limit the config sets."""
    sweep = config(dataset, tmp_path / "sweep", schedule={"name": "wsd", "warmup_steps": 2}, compile=False)
    sweep.train["precision"] = "fp32"
    sweep.grid = from_dict(CompareConfig, {"grid": {"budget": ["8 steps", "16 steps"], "branch": True}}).grid
    sweep.launch.slurm.partition, sweep.launch.slurm.cpus_per_task = "short", 4
    sweep.launch.slurm.mem_gb, sweep.launch.slurm.time_min = 8, 20
    logged: list[str] = []
    emit_sbatch(sweep, tmp_path / "sweep.sbatch", log=logged.append)
    first = (tmp_path / "sweep.sbatch").read_text()
    branches = (tmp_path / "sweep-branches.sbatch").read_text()

    def only(script: str) -> list[str]:
        return [
            line.rsplit(" ", 1)[1].strip("'")
            for line in script.split("RUNS=(\n")[1].split("\n)")[0].splitlines()
        ]

    assert only(first) == [f"16steps/{i}-s{s}" for s in (0, 1) for i in ("learned", "canonical")]
    assert only(branches) == [f"8steps/{i}-s{s}" for s in (0, 1) for i in ("learned", "canonical")]
    for expected in ("--partition=short", "--cpus-per-task=4", "--mem=8192M", "--time=20"):
        assert f"#SBATCH {expected}" in first.splitlines() and f"#SBATCH {expected}" in branches.splitlines()
    assert (
        f"`bash {tmp_path / 'sweep-submit.sh'}`" in logged[-1]
    )  # per-trunk afterok: tests/test_sweep_trips.py
    assert not any("cluster's defaults" in line for line in logged)


def _task_pid(controller_pid: int, timeout_s: float = 60) -> int:
    """The task process that submitit's local controller (the job id) started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{controller_pid}/task/{controller_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise TimeoutError(f"submitit controller {controller_pid} started no task")


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


@pytest.mark.slow
def test_local_executor_run_is_preempted_requeued_and_resumes_exactly(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = {"budget": "40 steps"}
    sweep = config(dataset, tmp_path / "cluster", **steps)
    sweep.interfaces, sweep.seeds = ["canonical"], [0]
    # the task waits after step 3 for its signal, which therefore lands inside training however fast the steps
    # are; the environment is the task's from its submission, so the reference run below does not hold
    monkeypatch.setenv(faults.HOLD_AFTER_STEP_ENV, "3")
    outcome = run_sweep(sweep, log=lambda *_: None)
    monkeypatch.delenv(faults.HOLD_AFTER_STEP_ENV)
    [job] = outcome["jobs"].values()
    [run] = plan_runs(sweep)
    _wait(lambda: logged_step(run.directory, 3), 120, "no step 3")
    os.kill(_task_pid(int(job)), launch.PREEMPT_SIGNAL)  # what SLURM sends before a time limit
    _wait(lambda: sweep_status(sweep, [run])[run.name]["state"] == "done", 240, "the run did not finish")

    log = "".join(path.read_text() for path in (tmp_path / "cluster" / "slurm").rglob("*.out"))
    assert re.search(r"stopped by SIGUSR2 after step [34]\b", log)  # 3: signalled before the hold began
    assert "checkpoint saved, requeueing" in log
    assert "resumed from" in log
    local = config(dataset, tmp_path / "local", backend="local", **steps)
    local.interfaces, local.seeds = ["canonical"], [0]
    run_sweep(local, report=False, log=lambda *_: None)
    [reference] = plan_runs(local)

    def losses(directory: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}

    assert losses(run.directory) == losses(reference.directory)  # bit for bit across the preemption
    evaluated, expected = (
        json.loads((d / "eval.json").read_text()) for d in (run.directory, reference.directory)
    )
    assert evaluated["tasks"] == expected["tasks"]


def test_sigusr2_stops_the_trainer_like_sigterm() -> None:
    from tablefree.train.trainer import STOP_SIGNALS, StopSignal

    assert launch.PREEMPT_SIGNAL in STOP_SIGNALS
    stop = StopSignal()
    with stop.installed():
        signal.raise_signal(launch.PREEMPT_SIGNAL)
    assert stop.requested == "SIGUSR2"


def test_a_hold_waits_after_its_step_until_the_stop_and_no_longer_than_its_limit() -> None:
    asked = []
    hold = faults.HoldAfterStep(3, lambda: len(asked) >= 4 or bool(asked.append(1)), limit_s=30)
    assert [hold.needs_read(s) for s in (2, 3, 4)] == [False, True, False]
    hold.after_step(2)
    assert asked == []  # another step: no wait
    hold.after_step(3)
    assert len(asked) == 4  # asked until the stop was requested
    never = faults.HoldAfterStep(3, lambda: False, limit_s=0.2)
    started = time.monotonic()
    never.after_step(3)
    assert 0.2 <= time.monotonic() - started < 5


@pytest.mark.slow
def test_a_sbatch_line_exits_for_requeue_when_preempted_and_then_finishes(
    dataset: Path, tmp_path: Path
) -> None:
    """One line of the sbatch script, as a task runs it: SIGUSR2 while training -> saved, exit status 75
    (the script requeues on it); the same line again resumes and finishes."""
    import shlex
    import sys

    sweep = config(dataset, tmp_path / "sweep", budget="40 steps")
    sweep.interfaces, sweep.seeds = ["affine"], [1]
    sweep.launch.slurm.python = shlex.quote(sys.executable)
    emit_sbatch(sweep, tmp_path / "sweep.sbatch", log=lambda *_: None)
    [line] = (tmp_path / "sweep.sbatch").read_text().split("RUNS=(\n")[1].split("\n)")[0].splitlines()
    command = shlex.split(shlex.split(line)[0])
    [run] = plan_runs(sweep)
    held = dict(os.environ, **{faults.HOLD_AFTER_STEP_ENV: "3"})  # waits after step 3 for the signal
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=held)
    _wait(lambda: logged_step(run.directory, 3), 120, "no step 3")
    process.send_signal(launch.PREEMPT_SIGNAL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == launch.REQUEUE_EXIT_CODE, output
    assert re.search(r"stopped by SIGUSR2 after step [34]\b", output) and "exiting for requeue" in output
    assert sweep_status(sweep, [run])[run.name]["state"] == "interrupted"
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from" in again.stdout
    assert sweep_status(sweep, [run])[run.name]["state"] == "done"
