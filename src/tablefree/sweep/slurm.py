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
    the branches of unfinished trunks go in a second script (``PATH`` with ``-branches``), and a third
    (``-submit.sh``) submits the first, then each trunk's branches as their own array that waits
    (``--dependency=afterok:JOB_TASK``) on that trunk's task alone: a failed trunk holds back its own branches,
    not every other trunk's."""
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
        submit = path.with_name(f"{path.stem}-submit.sh")
        launch.write_sbatch(
            submit, submit_script(path, first, scripts[1][0], waiting, spec.array_parallelism)
        )
        log(
            f"wrote {path} ({len(first)} runs), {scripts[1][0]} ({len(waiting)} branches of those trunks) and "
            f"{submit}, which submits both, each trunk's branches waiting on that trunk's own task; submit with "
            f"`bash {submit}` (logs in {folder})"
        )
    else:
        log(f"wrote {path}: {len(first)} runs; submit with `sbatch {path}` (logs in {folder})")
    return first + waiting


def submit_script(
    path: Path, first: list[RunPlan], branches_path: Path, waiting: list[RunPlan], parallelism: int
) -> str:
    """A bash script that submits ``path`` (the trunks and other runs), then per trunk one array of its
    branches (their lines of ``branches_path``, ``--array`` overriding the script's own) with
    ``--dependency=afterok:JOB_TASK`` on the trunk's task in the first array."""
    task = {run.name: index for index, run in enumerate(first)}
    groups: dict[str, list[int]] = {}  # trunk name: the branches' lines, contiguous in the plan's order
    for index, run in enumerate(waiting):
        assert run.branch is not None
        groups.setdefault(run.branch.trunk, []).append(index)
    lines = [
        "#!/bin/bash",
        "# Submits the runs, then each trunk's branches waiting on that trunk's own array task (afterok).",
        "set -euo pipefail",
        f"jid=$(sbatch --parsable {shlex.quote(str(path))})",
        'jid="${jid%%;*}"  # --parsable prints JOB or JOB;CLUSTER',
        f'echo "{path.name}: job $jid"',
    ]
    for trunk, indices in groups.items():
        contiguous = indices == list(range(indices[0], indices[-1] + 1))
        tasks = f"{indices[0]}-{indices[-1]}" if contiguous else ",".join(map(str, indices))
        limit = min(len(indices), parallelism)
        lines.append(
            f'sbatch --parsable --dependency="afterok:${{jid}}_{task[trunk]}" --array={tasks}%{limit} '
            f"{shlex.quote(str(branches_path))}  # the branches of {trunk}"
        )
    return "\n".join(lines) + "\n"


# the per-job resources an sbatch script leaves to the cluster when the config does not set them
SBATCH_RESOURCES = ("partition", "cpus_per_task", "mem_gb", "time_min")
