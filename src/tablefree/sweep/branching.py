"""A budget branch's start from its trunk on disk: the trunk's checkpoint at the branch step (hard-linked where
the filesystem allows) and its metrics up to it, seeded into the branch's run directory, and ``branch.json``
recording where it came from. The branching itself (which run is whose trunk, at which step) is the plan's
(``tablefree.sweep.plan.branch_budgets``)."""

from __future__ import annotations

import datetime
import os
import shutil

from tablefree.checkpoint import layout
from tablefree.checkpoint.verify import verify_digests
from tablefree.fileio import read_json, write_json_atomic
from tablefree.rundir import RUN_FILES
from tablefree.sweep.branch_record import dependency_digests
from tablefree.sweep.plan import RunPlan


def start_branch(run: RunPlan) -> bool:
    """Seed a branch's run directory with its trunk's checkpoint at the branch step (hard links where the
    filesystem allows: checkpoints are never written again) and the trunk's metrics up to it; the trainer then
    resumes there with the branch's own recipe. False when the branch has a checkpoint of its own already, or
    when its trunk finished without this branch point (a budget added later): it then trains from scratch."""
    assert run.branch is not None
    if layout.complete_checkpoints(run.directory):
        return False
    source = run.branch.directory / layout.CHECKPOINTS_DIR / layout.step_dir_name(run.branch.step)
    trunk_summary = read_json(run.branch.directory / RUN_FILES["summary"], default=None) or {}
    if not layout.is_complete(source) and trunk_summary.get("completed"):
        # the trunk finished before this budget joined the grid, so it kept no checkpoint here: the branch is
        # the same run as training from scratch, which is what happens
        return False
    if not layout.is_complete(source) and not run.branch.directory.exists():
        raise RuntimeError(
            f"{run.name} starts from {run.branch.trunk}'s checkpoint at step {run.branch.step}, and "
            f"{run.branch.trunk}'s run directory {run.branch.directory} does not exist (deleted?): the sweep "
            f"command trains {run.branch.trunk} again first, keeping a checkpoint at every branch step, then its "
            f"branches; run it (with --only, run {run.branch.trunk} before this run)"
        )
    if not layout.is_complete(source):
        raise RuntimeError(
            f"{run.name} starts from {run.branch.trunk}'s checkpoint at step {run.branch.step}, and {source} "
            "is not a complete checkpoint: the trunk run must finish first (re-run the sweep; it trains trunks "
            "before their branches)"
        )
    try:  # the branch's copy shares the trunk's files: a damaged one is the trunk's, and so is the way out
        verify_digests(source)
    except layout.CheckpointError as error:
        raise RuntimeError(
            f"{run.name} starts from {run.branch.trunk}'s checkpoint at step {run.branch.step}, which is "
            f"damaged ({error}); retrain that trunk: delete {run.branch.directory} and re-run the command (it "
            f"trains {run.branch.trunk} again, keeping a checkpoint at every branch step, then its branches)"
        ) from None
    root = run.directory / layout.CHECKPOINTS_DIR
    staging = root / f".{source.name}.branch"
    shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while copying
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, staging, copy_function=_link_or_copy)
    metrics = run.branch.directory / RUN_FILES["metrics"]
    if metrics.exists():  # the trainer cuts it back to the branch step
        shutil.copyfile(metrics, run.directory / RUN_FILES["metrics"])
    write_json_atomic(
        run.directory / RUN_FILES["branch"],
        {
            "trunk": run.branch.trunk,
            "trunk_dir": os.path.relpath(run.branch.directory, run.directory),
            "step": run.branch.step,
            "checkpoint_sha256": read_json(source / layout.COMPLETE_MARKER).get("sha256"),
            # what it trains from: a trunk retrained to the same state is accepted (sweep.branch_record)
            "depends_sha256": dependency_digests(source),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    staging.rename(root / source.name)
    return True


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
