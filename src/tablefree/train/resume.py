"""Whether and how a run directory may be trained in: its lock, the resume policy, and the dataset checks.

A fresh run must not overwrite another run's checkpoints; a resumed one continues its recorded recipe
(``config.yaml`` as first written, plus the changes recorded in ``config_changes.json``): a field that differs
is refused unless named in ``allow_change``, and the fields of ``FIXED_ON_RESUME`` never change within a run.
The dataset is checked against its manifest before training, and on resume against the tokenizer the run was
trained with.
"""

from __future__ import annotations

import fcntl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tablefree.checkpoint.layout import (
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    META_FILE,
    CheckpointError,
    complete_checkpoints,
    has_checkpoints,
)
from tablefree.checkpoint.training import read_meta, verify_digests
from tablefree.config_parsing import load_yaml, to_dict
from tablefree.data.loader import Dataset
from tablefree.fileio import read_json, try_pid_lock, write_json_atomic
from tablefree.rundir import RUN_FILES
from tablefree.train.parallelize import DistInfo, any_rank, barrier
from tablefree.train.recipe import TrainConfig

CONFIG_FILE = RUN_FILES["config"]
METRICS_FILE = RUN_FILES["metrics"]
CHANGES_FILE = "config_changes.json"
# Fields that decide what the run computes and cannot change on resume, even when asked: the weights, the
# data order and the position in it are tied to them.
FIXED_ON_RESUME = ("model", "seed", "seq_len", "batch_tokens")
# Fields that say how the run executes, not what it computes: free to change on resume (another machine).
OPERATIONAL_FIELDS = (
    "device",
    "compile",
    "activation_checkpointing",
    "parallel",
    "peak_flops",
    "log_every",
    "val_every",
    "checkpoint_every",
    "checkpoint_steps",
    "keep_last",
    "micro_batch",
    "on_nonfinite",
    "checkpoint_format",
    "device_memory",
)


class RunDirLock:
    """An exclusive lock on a run directory (``RUN_DIR/.lock``, held by the main process), so two trainings
    never write one run. It is an ``flock``: the kernel releases it when the process exits, however it exits,
    so a killed run never leaves a stale lock behind."""

    FILE = ".lock"

    def __init__(self, run_dir: Path, info: DistInfo) -> None:
        self.run_dir, self.info, self.handle = run_dir, info, None
        self.created = False

    def __enter__(self) -> RunDirLock:
        error = None
        if self.info.is_main:
            self.created = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path = self.run_dir / self.FILE
            self.handle, holder = try_pid_lock(path)
            if self.handle is None:
                error = (
                    f"{self.run_dir} is in use by another training process (pid {holder}; lock {path}). Wait for "
                    "it to finish or stop it; the lock is released when that process exits"
                )
        if any_rank(error is not None, self.info.device):
            raise RunDirInUseError(error or f"{self.run_dir} is in use by another training process")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            if [p.name for p in self.run_dir.iterdir()] == [self.FILE]:
                (
                    self.run_dir / self.FILE
                ).unlink()  # a run that failed before writing anything leaves nothing
                if self.created:
                    self.run_dir.rmdir()
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


class RunDirInUseError(FileExistsError):
    """Another process is training in this run directory."""


def nothing_to_resume(run_dir: Path) -> str:
    """The error for ``--resume`` on a run directory without a checkpoint, saying where it looked."""
    where = run_dir / CHECKPOINTS_DIR
    if not run_dir.exists():
        found = f"{run_dir} does not exist"
    elif not where.exists():
        found = f"{run_dir} has no {CHECKPOINTS_DIR}/ directory"
    else:
        found = f"{where} holds no complete step_* checkpoint"
    return (
        f"--resume: nothing to resume: {found} (looked for {where}/step_*/{COMPLETE_MARKER}). Check --run-dir, "
        "or start the run without --resume"
    )


@dataclass(frozen=True)
class Change:
    """A field of the recipe changed on resume."""

    field: str  # dotted, e.g. optim.lr
    recorded: Any
    now: Any


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


def read_changes(run_dir: Path) -> list[dict[str, Any]]:
    """The history of recipe changes made on resume (``config_changes.json``), oldest first."""
    path = run_dir / CHANGES_FILE
    if not path.exists():
        return []
    history = read_json(path)
    if not isinstance(history, list) or not all(
        isinstance(entry, dict) and {"after_step", "field", "to"} <= entry.keys() for entry in history
    ):
        raise ValueError(f"{path}: expected a list of {{after_step, field, from, to}} records")
    return history


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's current recipe: config.yaml (as first written, never rewritten) with the changes of
    config_changes.json applied in order; None when the run has no config.yaml."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return None
    recipe = load_yaml(path)
    for entry in read_changes(run_dir):
        set_dotted(recipe, entry["field"], entry["to"])
    return recipe


def check_run_dir(
    run_dir: Path, config: TrainConfig, resume: bool, allow_change: Sequence[str], info: DistInfo
) -> list[Change]:
    """A fresh run must not overwrite another run's checkpoints; a resumed one continues its recorded recipe.
    Returns the changes to the recipe that ``allow_change`` permits."""
    changes: list[Change] = []
    if not resume and has_checkpoints(run_dir):
        raise FileExistsError(
            f"{run_dir} already holds a run; pass resume=True / --resume to continue it, or choose another run "
            "directory"
        )
    if resume:
        changes = check_resumable(run_dir, config, allow_change)
    elif info.is_main and (run_dir / METRICS_FILE).exists():
        print(
            f"starting {run_dir} over: it holds no checkpoint (a run stopped before its first save)",
            flush=True,
        )
    barrier()  # every process has checked before rank 0 writes anything
    return changes


def check_resumable(run_dir: Path, config: TrainConfig, allow_change: Sequence[str] = ()) -> list[Change]:
    """Resuming continues the recorded recipe. Each field that differs is named; fields of FIXED_ON_RESUME
    are refused always, others unless named (or their section named) in ``allow_change``. Returns the
    permitted changes."""
    recorded = recorded_config(run_dir)
    if recorded is None:
        return []
    where = run_dir / CONFIG_FILE
    was, now = flatten(recorded), flatten(to_dict(config))
    differing = [  # a field only one side has (a field added by a later version) is not a change
        Change(name, was[name], now[name])
        for name in sorted(was.keys() & now.keys())
        if was[name] != now[name] and name.split(".")[0] not in OPERATIONAL_FIELDS
    ]

    def listed(changes: list[Change]) -> str:
        return "\n".join(f"  {c.field}: {c.recorded!r} recorded, {c.now!r} now" for c in changes)

    fixed = [c for c in differing if c.field.split(".")[0] in FIXED_ON_RESUME]
    if fixed:
        raise ValueError(
            f"--resume: the run in {run_dir} was trained with a different experiment ({where}):\n{listed(fixed)}\n"
            "These cannot change within a run; start a new run directory to change them"
        )
    allowed = {name.strip() for name in allow_change}
    refused = [c for c in differing if not any(c.field == a or c.field.startswith(a + ".") for a in allowed)]
    if refused:
        flags = " ".join(f"--allow-change {c.field}" for c in refused)
        raise ValueError(
            f"--resume continues the recorded recipe ({where}), and these fields differ from it:\n"
            f"{listed(refused)}\nDrop these overrides to continue unchanged, or pass {flags} to change them from "
            f"the resumed step on (recorded in {run_dir / CHANGES_FILE}; config.yaml is kept as first written)"
        )
    return differing


def record_changes(run_dir: Path, changes: list[Change], step: int) -> None:
    """Append permitted recipe changes to the run's history, with the step they take effect after."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    history = read_changes(run_dir) + [
        {"after_step": step, "field": c.field, "from": c.recorded, "to": c.now, "time": when} for c in changes
    ]
    write_json_atomic(run_dir / CHANGES_FILE, history)
    for c in changes:
        print(
            f"--resume: {c.field} changed from {c.recorded!r} to {c.now!r} after step {step} (--allow-change)",
            flush=True,
        )


def verify_dataset_on_all_ranks(dataset: Dataset, info: DistInfo) -> None:
    """Shards against the manifest before training: sizes always, sha256 and token ids too when the dataset
    is small enough to hash in a few seconds (``verify_dataset(hashes="auto")``); a damaged dataset is refused
    on every process."""
    check = dataset.verify(hashes="auto") if info.is_main else None
    if any_rank(check is not None and not check.ok, info.device):
        detail = (
            check.format()
            if check is not None
            else f"{dataset.directory}: damaged (see the main process's message)"
        )
        raise ValueError(
            f"data.dir {detail}\nPrepare the dataset again (tablefree data prepare) or restore its files"
        )


def verify_dataset_matches_run(run_dir: Path, dataset: Dataset) -> None:
    """Resuming onto a dataset tokenized differently from the run's is refused, naming both datasets: when no
    checkpoint records the dataset's tokenizer (a newest one that alone differs is damage: resuming skips it)."""
    manifest = dataset.manifest
    verified = []
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        try:
            verify_digests(checkpoint, only=(META_FILE,))
            verified.append((checkpoint, read_meta(checkpoint)))
        except CheckpointError:
            continue  # a damaged meta.json: resuming reports it
    if any(meta.get("tokenizer_hash") == manifest.get("tokenizer_hash") for _, meta in verified):
        return
    for checkpoint, meta in verified[:1]:
        trained = meta.get("tokenizer_hash")
        if trained != manifest.get("tokenizer_hash"):
            raise ValueError(
                f"--resume: the dataset {dataset.directory} (tokenizer {str(manifest.get('tokenizer_hash'))[:12]}…, "
                f"{manifest.get('vocab_size')} tokens) is not tokenized like the one this run was trained on "
                f"({meta.get('data_dir')}, tokenizer {str(trained)[:12]}…, per {checkpoint / META_FILE}); "
                f"resume with data.dir={meta.get('data_dir')}, or a dataset prepared with that tokenizer"
            )
        return
