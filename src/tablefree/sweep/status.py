"""Where each run of a sweep stands: ``run_state`` from its run directory (``done``, ``trained``, ``todo``), and
``sweep_status`` adding the status file's ``failed``/``interrupted``/``running`` and, for a sweep submitted to
SLURM, each run's job and the scheduler's state."""

from __future__ import annotations

import contextlib
import fcntl
import socket
from collections.abc import Iterator
from pathlib import Path

from tablefree import launch
from tablefree.fileio import read_json, try_pid_lock
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
    # and from before coverage was recorded (the last short window was dropped then), and the frequency bands
    per_document = "validation" not in spec.tasks or {"per_document", "coverage", "frequency_bands"} <= set(
        tasks.get("validation", {})
    )
    examples = (run.directory / RUN_FILES["examples"]).exists()
    selection = not run.select_every or (run.directory / RUN_FILES["selection"]).exists()
    return "done" if current and per_document and examples and selection else "trained"


def check_branch(run: RunPlan) -> None:
    """A branch's ``branch.json`` verified against its trunk (``read_branch``) and its step against the plan's:
    the branch step is the decay start of the run's own budget, whichever run was its trunk. A branch whose
    trunk's directory is gone waits: the sweep trains that trunk again first, and the branch is checked
    against it before its own turn (``run_local``, ``run_job``)."""
    if run.branch is not None and not run.branch.directory.exists():
        return
    record = read_branch(run.directory)
    if record is not None and run.branch is not None and record["step"] != run.branch.step:
        raise ValueError(
            f"{run.directory / RUN_FILES['branch']}: step {record['step']}, but {run.name}'s budget decays from "
            f"step {run.branch.step}, where it branches; delete {run.directory} and re-run the sweep command (it "
            "branches that run again from its trunk's checkpoint)"
        )


def check_branches(plans: list[RunPlan]) -> None:
    """Every branch's record checked (``check_branch``) before any run trains, resumes or is submitted: a
    deleted or damaged ``branch.json`` is refused now, not when the report is written after the sweep."""
    for run in plans:
        check_branch(run)


def jobs_folder(config: CompareConfig) -> Path:
    return Path(config.launch.slurm.folder or config.out_dir / "slurm")


def sweep_status(config: CompareConfig, plans: list[RunPlan]) -> dict[str, dict[str, str]]:
    """{run name: {"state": from the run directory, "job": id, "queue": the scheduler's state}}; ``state``
    is ``done``, ``trained``, ``todo`` or the status file's ``failed``/``interrupted``/``running``."""
    jobs = launch.recorded_jobs(jobs_folder(config))
    queue = launch.queue_states(config.launch.slurm) if jobs else {}
    status = {}
    check_branches(plans)
    for run in plans:
        state = run_state(run, config.eval)
        recorded = (read_json(run.directory / RUN_FILES["status"], default=None) or {}).get("state")
        if state != "done" and recorded in ("failed", "interrupted", "running"):
            state = recorded
        job = jobs.get(run.name, "")
        status[run.name] = {"state": state, "job": job, "queue": queue.get(job, "")}
    return status


# held by the sweep running here (``run_local``): its pid and host, for ``--status`` and a second ``compare``
SWEEP_LOCK = ".compare.lock"


class SweepInUseError(FileExistsError):
    """Another process runs this sweep here."""


@contextlib.contextmanager
def hold_sweep(out_dir: Path) -> Iterator[None]:
    """The sweep directory's lock (``OUT/.compare.lock``: an ``flock`` holding this process's pid and host), for
    as long as the sweep runs here; the kernel releases it however the process ends. SweepInUseError, naming
    the holder, when another process holds it."""
    path = Path(out_dir) / SWEEP_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, _ = try_pid_lock(path)
    if handle is None:
        holder = sweep_holder(out_dir)
        who = describe_holder(holder) if holder else f"lock {path}"
        raise SweepInUseError(
            f"{out_dir} is in use by another `tablefree compare` ({who}); wait for it to finish or stop it, or "
            "see where it stands with --status"
        )
    handle.write(f"{socket.gethostname()}\n")
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def sweep_holder(out_dir: Path) -> dict[str, str] | None:
    """``{"pid", "host", "lock"}`` of the process running the sweep in ``out_dir`` now, or None when none holds
    its lock. The probe is a shared lock taken and released at once, so it never writes the file."""
    path = Path(out_dir) / SWEEP_LOCK
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            lines = handle.read().split()
            return {
                "pid": lines[0] if lines else "unknown",
                "host": lines[1] if len(lines) > 1 else "unknown",
                "lock": str(path),
            }
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def describe_holder(holder: dict[str, str]) -> str:
    return f"pid {holder['pid']} on host {holder['host']}; lock {holder['lock']}"
