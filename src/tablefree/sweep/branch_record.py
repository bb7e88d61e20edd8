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

import hashlib
from pathlib import Path
from typing import Any

import torch

from tablefree.checkpoint import layout
from tablefree.config_parsing import load_yaml
from tablefree.fileio import read_json
from tablefree.rundir import RUN_FILES, read_jsonl

# metrics.jsonl fields measured by the clock: equal only in a record copied from another run
WALL_CLOCK_KEYS = ("elapsed_s", "tokens_per_s", "tflops", "mfu")


def read_branch(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``branch.json`` (``{"trunk", "trunk_dir", "step", ...}``) verified against its trunk, or None
    for a run trained from scratch. ValueError, naming the file and the way out, when the record disagrees with
    the trunk or is missing from a run whose metrics show it was branched."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_FILES["branch"]
    way_out = f"delete {run_dir} and re-run the sweep command (it branches that run again from its trunk's checkpoint)"
    try:
        record = read_json(path, default=None)
    except ValueError as error:  # damaged: names the file and the line
        raise ValueError(f"{error}; {way_out}") from None
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
    retrained = (
        "checkpoint_sha256" in record and digests is not None and digests != record["checkpoint_sha256"]
    )
    if retrained:
        changed = _changed_dependencies(run_dir, record, marker.parent)
        if changed:
            raise ValueError(
                f"{path}: the checkpoint it started from is not {record['trunk']}'s checkpoint at step {step} "
                f"({marker.parent}): {changed}; {way_out}"
            )
    own, trunk = read_jsonl(run_dir / RUN_FILES["metrics"]), read_jsonl(trunk_dir / RUN_FILES["metrics"])
    if own and trunk:
        if retrained:  # the same training again: its records differ from the copied ones only in the clock
            own, trunk = _untimed(own), _untimed(trunk)
        if _up_to(own, step) != _up_to(trunk, step):
            raise ValueError(
                f"{path}: {run_dir / RUN_FILES['metrics']} up to step {step} is not {record['trunk']}'s, so the "
                f"run did not start from it at step {step}; {way_out}"
            )
        after = next((r for r in own if r.get("step", 0) > step and (retrained or _timed(r))), None)
        if after is not None and after in trunk:
            raise ValueError(
                f"{path}: {run_dir / RUN_FILES['metrics']} is {record['trunk']}'s past step {step} (step "
                f"{after['step']}), so the run started from it later than step {step}; {way_out}"
            )
    return record


def dependency_digests(checkpoint: Path) -> dict[str, str]:
    """What a branch started from a checkpoint depends on, one digest each: the weights (the model's files:
    ``model.safetensors``, or a sharded checkpoint's files), the optimizer state and the data position (step,
    tokens seen, the loader's position). Left out: wall-clock fields and the unseeded global random-generator
    states in ``train_state.pt``, which differ between two trainings of the same run, so the file's digest
    alone would refuse a trunk retrained bit for bit."""
    # Imported here: it loads torch.distributed.checkpoint, which the report and status verbs (readers of
    # branch records) never need
    from tablefree.checkpoint.training import load_train_state

    files = read_json(checkpoint / layout.COMPLETE_MARKER).get("sha256") or {}
    state = load_train_state(checkpoint)
    weights = {name: digest for name, digest in files.items() if name not in NOT_WEIGHTS}
    position = {key: state[key] for key in ("step", "tokens_seen", "loader")}
    return {
        "weights": _digest(weights),
        "optimizer state": _digest(state["optimizer"]),
        "data position": _digest(position),
    }


# checkpoint files that are not the weights: the training state (compared by its parts), the metadata (losses,
# the dataset's path), the config (a trunk retrained for a grid with another budget keeps other checkpoint
# steps; a changed model shows in the weights) and the dataset's tokenizer (checked against the dataset)
NOT_WEIGHTS = (layout.TRAIN_STATE_FILE, layout.META_FILE, layout.CONFIG_FILE, layout.TOKENIZER_FILE)


def _changed_dependencies(run_dir: Path, record: dict[str, Any], checkpoint: Path) -> str | None:
    """Why the trunk's checkpoint at the branch step is not what the branch started from, or None when its
    files differ only where the branch does not depend on them (a trunk retrained bit for bit). The reference
    is the record's ``depends_sha256``, or for a record written before it, the branch's own copy of the
    checkpoint (hard-linked from the trunk's when it was branched)."""
    reference = record.get("depends_sha256")
    if not isinstance(reference, dict):
        copy = run_dir / layout.CHECKPOINTS_DIR / checkpoint.name
        copied = read_json(copy / layout.COMPLETE_MARKER, default={}).get("sha256") if copy.exists() else None
        if copied != record["checkpoint_sha256"]:
            return (
                "its files differ, and neither branch.json nor the branch's own copy of that checkpoint says "
                "whether the weights, optimizer state or data position changed"
            )
        reference = dependency_digests(copy)
    current = dependency_digests(checkpoint)
    changed = [part for part in current if current[part] != reference.get(part)]
    if not changed:
        return None
    return f"its {' and '.join(changed)} {'differs' if len(changed) == 1 else 'differ'} from what the branch started from"


def _digest(value: Any) -> str:
    """sha256 of nested dicts, lists, tensors and plain values, the same for equal contents (dict order and
    tensor storage aside)."""
    digest = hashlib.sha256()

    def feed(item: Any) -> None:
        if isinstance(item, dict):
            digest.update(b"{")
            for key in sorted(item, key=str):
                feed(str(key))
                feed(item[key])
            digest.update(b"}")
        elif isinstance(item, (list, tuple)):
            digest.update(b"[")
            for element in item:
                feed(element)
            digest.update(b"]")
        elif isinstance(item, torch.Tensor):
            flat = item.detach().cpu().contiguous().reshape(-1)
            digest.update(f"tensor {item.dtype} {tuple(item.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{type(item).__name__} {item!r};".encode())

    feed(value)
    return digest.hexdigest()


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


def _untimed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


def _timed(record: dict[str, Any]) -> bool:
    return any(key in record for key in WALL_CLOCK_KEYS)
