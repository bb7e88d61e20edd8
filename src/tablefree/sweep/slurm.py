"""The sweep on a SLURM cluster, an executor of the same plan as ``tablefree.sweep.local``: each run is one task
of a job array calling ``run_job`` (``tablefree.launch`` submits through submitit and requeues on preemption),
or one line of a plain sbatch script (``emit_sbatch``) whose tasks call ``tablefree compare --only RUN``."""

from __future__ import annotations

import contextlib
import copy
import functools
import shlex
from pathlib import Path
from typing import Any

from tablefree import launch
from tablefree.config_parsing import to_dict
from tablefree.fileio import read_json
from tablefree.rundir import RUN_FILES
from tablefree.sweep.config import CompareConfig
from tablefree.sweep.dataset import prepare_data
from tablefree.sweep.plan import RunPlan, check_plans, check_sweep, plan_runs
from tablefree.sweep.record import write_sweep_config, write_yaml_atomic
from tablefree.sweep.run import execute_run, train_run
from tablefree.sweep.status import check_branch, check_branches, jobs_folder, run_state, sweep_status


def submit_sweep(config: CompareConfig, plans: list[RunPlan], log=print) -> dict[str, Any]:
    """Submit every run that is neither done nor queued as one SLURM job array, and return at once."""
    status = sweep_status(config, plans)
    runs: dict[str, str] = {}
    tasks = {}
    for run in plans:
        current = status[run.name]
        if current["state"] == "done":
            runs[run.name] = "done"
        elif current["queue"] in launch.ACTIVE_STATES:
            runs[run.name] = f"queued ({current['queue']}, job {current['job']})"
        elif run.branch is not None and status[run.branch.trunk]["state"] not in ("done", "trained"):
            # a budget branch starts from its trunk's checkpoint: submitted by the next `compare` after it
            runs[run.name] = f"waits for {run.branch.trunk} (re-run this command once it has finished)"
        else:
            tasks[run.name] = functools.partial(run_job, config, run)
    folder = jobs_folder(config)
    jobs = launch.submit(config.launch.slurm, folder, config.name, tasks, log)
    runs.update({name: f"submitted (job {job})" for name, job in jobs.items()})
    for name, state in runs.items():
        log(f"{name}: {state}")
    log(
        f"`tablefree compare --config ... --status` shows each run; `tablefree report {config.out_dir}` at the end"
    )
    if config.analysis:
        log("note: analysis: true is not run on the cluster; run `tablefree analyze` on the finished runs")
    return {"out": str(config.out_dir), "runs": runs, "failed": [], "report": None, "jobs": jobs}


def run_job(config: CompareConfig, run: RunPlan) -> str:
    """One run as one cluster task, the same on every node of the job: ``execute_run`` on the first node
    (train, evaluate, status), the training alone on the others (their torchrun joins the first's).
    Raises ``launch.Preempted`` when the training stopped on the preemption signal after saving."""
    if config.launch.nproc_per_node >= 1:
        rendezvous = launch.rendezvous_args(config.launch.slurm.nodes, config.launch.slurm.port)
        config = copy.deepcopy(config)
        config.launch.torchrun_args = [*rendezvous, *config.launch.torchrun_args]
        signals = launch.preemption_signal_for_children()
    else:
        signals = contextlib.nullcontext()
    prefix = f"{run.name} (node {launch.node_rank()})"
    try:
        with signals:
            if launch.node_rank() != 0:
                train_run(config, run)
                return "trained"
            check_branch(run)
            state = run_state(run, config.eval)
            return "done" if state == "done" else execute_run(config, run, state, prefix, print)
    except KeyboardInterrupt:
        reason = str(
            (read_json(run.directory / RUN_FILES["summary"], default=None) or {}).get("stop_reason", "")
        )
        if reason in (f"stopped by {launch.PREEMPT_SIGNAL.name}", "stopped by a signal on another process"):
            raise launch.Preempted(f"{run.name}: {reason}") from None
        raise


def emit_sbatch(config: CompareConfig, path: Path, log=print) -> list[RunPlan]:
    """Write the sweep's unfinished runs as plain sbatch array scripts, one line per run (``tablefree compare
    --only RUN``), run from this directory (``--chdir``). A budget branch starts from its trunk's checkpoint, so
    the branches of unfinished trunks go in a second script (``PATH`` with ``-branches``), submitted with
    ``--dependency=afterok`` on the first: they start once every run of the first has finished."""
    plans = plan_runs(config)
    check_plans(config, plans)  # before a long data preparation
    prepare_data(config, log)
    states = {run.name: run_state(run, config.eval) for run in plans}
    todo = [run for run in plans if states[run.name] != "done"]
    if not todo:
        raise ValueError(f"every run of {config.out_dir} is done: nothing to write to {path}")
    check_sweep(config, todo)
    check_branches(plans)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    write_sweep_config(config, config.out_dir)
    # The config as resolved here (command-line overrides included), for the tasks to load.
    folder = jobs_folder(config)
    resolved = folder / "sweep.yaml"
    resolved.parent.mkdir(parents=True, exist_ok=True)
    write_yaml_atomic(resolved, {**to_dict(config), "launch": {**to_dict(config.launch), "backend": "local"}})
    python = launch.python_command(config.launch.slurm)
    base = f"{python} -m tablefree.cli compare --config {shlex.quote(str(resolved))} --no-report --only"
    waiting = [
        run for run in todo if run.branch is not None and states[run.branch.trunk] not in ("done", "trained")
    ]
    first = [run for run in todo if run not in waiting]
    scripts = [(path, first)]
    if waiting:
        scripts.append((path.with_name(f"{path.stem}-branches{path.suffix}"), waiting))
    for script_path, runs in scripts:
        commands = [f"{base} {shlex.quote(run.name)}" for run in runs]
        script = launch.sbatch_script(config.launch.slurm, config.name, folder, commands, Path.cwd())
        launch.write_sbatch(script_path, script)
    spec = config.launch.slurm
    unset = [f"launch.slurm.{key}" for key in SBATCH_RESOURCES if getattr(spec, key) is None]
    if unset:
        log(f"not set, so the cluster's defaults apply: {', '.join(unset)}")
    if waiting:
        log(
            f"wrote {path} ({len(first)} runs) and {scripts[1][0]} ({len(waiting)} branches of those trunks); "
            f"submit with `jid=$(sbatch --parsable {path}) && sbatch --dependency=afterok:$jid "
            f"{scripts[1][0]}` (logs in {folder})"
        )
    else:
        log(f"wrote {path}: {len(first)} runs; submit with `sbatch {path}` (logs in {folder})")
    return first + waiting


# the per-job resources an sbatch script leaves to the cluster when the config does not set them
SBATCH_RESOURCES = ("partition", "cpus_per_task", "mem_gb", "time_min")
