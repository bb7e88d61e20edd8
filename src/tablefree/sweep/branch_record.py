"""A budget branch's ``branch.json`` read back and verified against its trunk, by the report and by ``--status``
alike: the trunk named must keep a checkpoint at the step recorded (its ``config.yaml``'s ``checkpoint_steps``),
that checkpoint must be the one the branch started from (its digests), and the branch's ``metrics.jsonl`` must be
the trunk's up to that step and its own after it (the trainer copies the trunk's records up to the branch step,
wall-clock fields included, so a run trained from scratch never shares them). A branch whose record is missing
is recognised by those copied records. Either disagreement is refused, naming the file and the way out: a branch
is never counted as trained from scratch, nor at a step it did not start from.

Below the rest of ``tablefree.sweep`` and below ``tablefree.report`` (like ``sweep.grid``): it reads files only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tablefree.checkpoint import layout
from tablefree.config_parsing import load_yaml
from tablefree.fileio import read_json
from tablefree.rundir import RUN_FILES, read_jsonl

# metrics.jsonl fields measured by the clock: equal only in a record copied from another run
WALL_CLOCK_KEYS = ("elapsed_s", "tokens_per_s")


def read_branch(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``branch.json`` (``{"trunk", "trunk_dir", "step", ...}``) verified against its trunk, or None
    for a run trained from scratch. ValueError, naming the file and the way out, when the record disagrees with
    the trunk or is missing from a run whose metrics show it was branched."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_FILES["branch"]
    way_out = f"delete {run_dir} and re-run the sweep command (it branches that run again from its trunk's checkpoint)"
    record = read_json(path, default=None)
    if record is None:
        trunk = _branched_from(run_dir)
        if trunk is not None:
            raise ValueError(
                f"{path} is missing, but {run_dir / RUN_FILES['metrics']} begins with the records of {trunk}: "
                f"the run was branched from it and would be counted as trained from scratch; {way_out}"
            )
        return None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("trunk"), str)
        and isinstance(record.get("trunk_dir"), str)
        and isinstance(record.get("step"), int)
        and record["step"] >= 1
    ):
        raise ValueError(f"{path}: expected {{trunk, trunk_dir, step}} as the sweep writes it; {way_out}")
    step, trunk_dir = record["step"], run_dir / record["trunk_dir"]
    if not (trunk_dir / RUN_FILES["config"]).exists():
        raise ValueError(f"{path}: its trunk {trunk_dir} has no {RUN_FILES['config']}; {way_out}")
    kept = load_yaml(trunk_dir / RUN_FILES["config"]).get("checkpoint_steps") or []
    if step not in kept:
        raise ValueError(
            f"{path}: step {step} is no branch step of its trunk {record['trunk']} (which keeps checkpoints at "
            f"steps {kept}); {way_out}"
        )
    marker = trunk_dir / layout.CHECKPOINTS_DIR / layout.step_dir_name(step) / layout.COMPLETE_MARKER
    digests = read_json(marker, default={}).get("sha256") if marker.exists() else None
    if "checkpoint_sha256" in record and digests is not None and digests != record["checkpoint_sha256"]:
        raise ValueError(
            f"{path}: the checkpoint it started from is not {record['trunk']}'s checkpoint at step {step} "
            f"({marker.parent}); {way_out}"
        )
    own, trunk = read_jsonl(run_dir / RUN_FILES["metrics"]), read_jsonl(trunk_dir / RUN_FILES["metrics"])
    if own and trunk:
        if _up_to(own, step) != _up_to(trunk, step):
            raise ValueError(
                f"{path}: {run_dir / RUN_FILES['metrics']} up to step {step} is not {record['trunk']}'s, so the "
                f"run did not start from it at step {step}; {way_out}"
            )
        after = next((r for r in own if r.get("step", 0) > step and _timed(r)), None)
        if after is not None and after in trunk:
            raise ValueError(
                f"{path}: {run_dir / RUN_FILES['metrics']} is {record['trunk']}'s past step {step} (step "
                f"{after['step']}), so the run started from it later than step {step}; {way_out}"
            )
    return record


def _branched_from(run_dir: Path) -> str | None:
    """The longer run of the same interface and seed at another grid point whose first timed metrics record this
    run's is (a copy: the run was branched from it), or None."""
    own = read_jsonl(run_dir / RUN_FILES["metrics"])
    first = next((r for r in own if _timed(r)), None)
    if first is None:
        return None
    sharing = {}  # the trunk is the longest of the runs that share it (its other branches do too)
    for other in sorted(run_dir.parent.parent.glob(f"*/{run_dir.name}")):
        theirs = read_jsonl(other / RUN_FILES["metrics"]) if other != run_dir else []
        if first in theirs:
            sharing[f"{other.parent.name}/{other.name}"] = max(r.get("step", 0) for r in theirs)
    longest = max(sharing, key=sharing.get, default=None)
    return longest if longest and sharing[longest] > max(r.get("step", 0) for r in own) else None


def _up_to(records: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    return [r for r in records if r.get("step", 0) <= step]


def _timed(record: dict[str, Any]) -> bool:
    return any(key in record for key in WALL_CLOCK_KEYS)
