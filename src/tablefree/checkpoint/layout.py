"""The names and markers of the checkpoint format, and finding checkpoints on disk (no torch here)."""

from __future__ import annotations

from pathlib import Path

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
TRAIN_STATE_FILE = "train_state.pt"
COMPLETE_MARKER = "COMPLETE"  # written last: a directory without it is not a checkpoint
SHARDED_DIR = "sharded"  # DCP files of a sharded checkpoint
CHECKPOINTS_DIR = "checkpoints"  # a run directory's checkpoints
STEP_PREFIX = "step_"
DAMAGED_PREFIX = "damaged-"  # a skipped checkpoint is moved aside under this prefix, out of the step_* glob


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: a file missing, truncated, altered, of the wrong form, or holding
    non-finite weights. The message names the file."""


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def is_complete(directory: str | Path) -> bool:
    return (Path(directory) / COMPLETE_MARKER).exists()


def is_sharded(directory: str | Path) -> bool:
    return (Path(directory) / SHARDED_DIR / ".metadata").is_file()


def complete_steps(parent: str | Path) -> list[Path]:
    """The complete ``step_*`` checkpoint directories directly under ``parent``, oldest first."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.glob(f"{STEP_PREFIX}*") if p.is_dir() and is_complete(p))


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete step directories of a run, oldest first."""
    return complete_steps(Path(run_dir) / CHECKPOINTS_DIR)


def incomplete_checkpoints(run_dir: str | Path) -> list[Path]:
    """``step_*`` directories without a COMPLETE marker (damaged: a save only renames whole ones into place)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    return sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir() and not is_complete(p))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def has_checkpoints(run_dir: str | Path) -> bool:
    """Whether the run directory holds checkpoints (complete ones, or damaged ones set aside)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    return bool(complete_checkpoints(run_dir)) or any(root.glob(f"{DAMAGED_PREFIX}*"))


def staging_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is assembled before it is renamed into place (the same path on every
    process: the ranks of a sharded save write their shards there first)."""
    return Path(run_dir) / CHECKPOINTS_DIR / f".{step_dir_name(step)}.tmp"


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint, a run directory, or a directory of ``step_*`` checkpoints:
    the newest complete one."""
    return checkpoint_candidates(path)[0]


def checkpoint_candidates(path: str | Path) -> list[Path]:
    """What a reader given ``path`` may read, newest first: ``path`` alone when it is a checkpoint, else the
    complete ``step_*`` checkpoints of a run directory (or of a directory of them)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if is_complete(path):
        return [path]
    for parent in (path / CHECKPOINTS_DIR, path):
        steps = complete_steps(parent)
        if steps:
            return steps[::-1]
    raise FileNotFoundError(
        f"{path}: no complete checkpoint (a {STEP_PREFIX}* directory with a {COMPLETE_MARKER} marker)"
    )


def run_name_of(checkpoint: Path) -> str:
    """The run a checkpoint belongs to: ``RUN`` of ``RUN/checkpoints/step_*``, else the directory's own name."""
    return checkpoint.parent.parent.name if checkpoint.parent.name == CHECKPOINTS_DIR else checkpoint.name


def first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
