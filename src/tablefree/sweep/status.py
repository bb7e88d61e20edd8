"""Where each run of a sweep stands: ``run_state`` from its run directory (``done``, ``trained``, ``todo``), and
``sweep_status`` adding the status file's ``failed``/``interrupted``/``running`` and, for a sweep submitted to
SLURM, each run's job and the scheduler's state."""

from __future__ import annotations

from pathlib import Path

from tablefree import launch
from tablefree.fileio import read_json
from tablefree.rundir import RUN_FILES
from tablefree.sweep.branch_record import read_branch
from tablefree.sweep.config import CompareConfig, EvalSection
from tablefree.sweep.plan import RunPlan


def run_state(run: RunPlan, spec: EvalSection) -> str:
    """``done`` (trained, and evaluated on every task with the same limit), ``trained`` or ``todo``."""
    summary = read_json(run.directory / RUN_FILES["summary"], default=None)
    if not (summary and summary.get("completed")):
        return "todo"
    results = read_json(run.directory / RUN_FILES["eval"], default=None) or {}
    evaluated = set(results.get("tasks", {}))
    limits = (results.get("limit"), results.get("val_limit"))
    current = set(spec.tasks) <= evaluated and limits == (spec.limit, spec.val_limit)
    # validation results from before per-document losses existed: evaluate again (the report's bootstrap)
    tasks = results.get("tasks", {})  # none yet: trained, not evaluated
    # and from before coverage was recorded (the last short window was dropped then)
    per_document = "validation" not in spec.tasks or {"per_document", "coverage"} <= set(
        tasks.get("validation", {})
    )
    examples = (run.directory / RUN_FILES["examples"]).exists()
    selection = not run.select_every or (run.directory / RUN_FILES["selection"]).exists()
    return "done" if current and per_document and examples and selection else "trained"


def check_branch(run: RunPlan) -> None:
    """A branch's ``branch.json`` verified against its trunk (``read_branch``) and its step against the plan's:
    the branch step is the decay start of the run's own budget, whichever run was its trunk."""
    record = read_branch(run.directory)
    if record is not None and run.branch is not None and record["step"] != run.branch.step:
        raise ValueError(
            f"{run.directory / RUN_FILES['branch']}: step {record['step']}, but {run.name}'s budget decays from "
            f"step {run.branch.step}, where it branches; delete {run.directory} and re-run the sweep command (it "
            "branches that run again from its trunk's checkpoint)"
        )


def jobs_folder(config: CompareConfig) -> Path:
    return Path(config.launch.slurm.folder or config.out_dir / "slurm")


def sweep_status(config: CompareConfig, plans: list[RunPlan]) -> dict[str, dict[str, str]]:
    """{run name: {"state": from the run directory, "job": id, "queue": the scheduler's state}}; ``state``
    is ``done``, ``trained``, ``todo`` or the status file's ``failed``/``interrupted``/``running``."""
    jobs = launch.recorded_jobs(jobs_folder(config))
    queue = launch.queue_states(config.launch.slurm) if jobs else {}
    status = {}
    for run in plans:
        check_branch(run)
        state = run_state(run, config.eval)
        recorded = (read_json(run.directory / RUN_FILES["status"], default=None) or {}).get("state")
        if state != "done" and recorded in ("failed", "interrupted", "running"):
            state = recorded
        job = jobs.get(run.name, "")
        status[run.name] = {"state": state, "job": job, "queue": queue.get(job, "")}
    return status
