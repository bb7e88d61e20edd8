"""Sharded training checkpoints with ``torch.distributed.checkpoint`` (DCP), as torchtitan saves them.

Under FSDP2 with several processes a full checkpoint gathers every weight and Adam moment to rank 0 when it is
saved and makes every rank read all of it when it resumes (for ``paper-1.7b`` on 8 ranks: about 8 × 21 GB of host
memory). A sharded checkpoint instead has each rank write and read only its own shards::

    checkpoints/step_00000100/
        sharded/            # DCP: .metadata + one __<rank>_0.distcp file per rank, model and optimizer state
        config.json  tokenizer.json  meta.json  train_state.pt (no optimizer: it is in sharded/)  COMPLETE

DCP reshards on load, so such a checkpoint resumes at any world size, with FSDP2, DDP or one process. For
inference it is read in one process without a process group (``read_model_state``), through
``model_dir.load_model`` like a full one: ``tablefree eval``, ``export``, ``generate``, ``analyze`` and the
lm-eval adapter take it as they take a full checkpoint, and ``model_dir.consolidate`` writes the usual single
``model.safetensors`` beside it. Before DCP reads anything, ``check_shards`` checks that every file the metadata
names is there and long enough, so a missing or truncated shard is a ``CheckpointError`` naming the file even
under ``--no-verify`` (the digests in ``COMPLETE`` catch any other change to a shard).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tablefree.checkpoint.layout import SHARDED_DIR, CheckpointError, first_line

METADATA_FILE = ".metadata"  # DCP's index of the shard files and of where each tensor lies in them


def save_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's shards of the model and optimizer state under ``directory/sharded`` (a collective:
    every process calls it with the same ``directory``)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_state, "optimizer": optim_state}, checkpoint_id=str(Path(directory) / SHARDED_DIR)
    )


def load_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load model and optimizer state from ``directory/sharded`` into a (possibly sharded or wrapped) model on
    every process; each rank reads only the pieces of its own shards."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(Path(directory) / SHARDED_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def shard_files(directory: str | Path) -> list[Path]:
    """The files of a sharded checkpoint's ``sharded/`` (the DCP metadata and every shard), sorted."""
    return sorted(p for p in (Path(directory) / SHARDED_DIR).rglob("*") if p.is_file())


def check_shards(directory: str | Path) -> None:
    """Every shard file that ``sharded/.metadata`` names exists and holds the bytes the metadata places in it;
    otherwise a CheckpointError naming the file (the metadata itself, when it is missing or unreadable)."""
    root = Path(directory) / SHARDED_DIR
    metadata_path = root / METADATA_FILE
    if not metadata_path.is_file():
        raise CheckpointError(f"{metadata_path}: missing (a sharded checkpoint's DCP metadata)")
    try:
        metadata = dcp.FileSystemReader(str(root)).read_metadata()
    except Exception as error:  # DCP unpickles it: truncation and damage surface as many exception types
        raise CheckpointError(
            f"{metadata_path}: unreadable ({type(error).__name__}: {first_line(error)})"
        ) from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    if not needed:
        raise CheckpointError(f"{metadata_path}: names no shard files")
    for name, size in sorted(needed.items()):
        path = root / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (a shard named in {metadata_path})")
        if path.stat().st_size < size:
            raise CheckpointError(
                f"{path}: truncated ({path.stat().st_size:,} bytes; {metadata_path} places {size:,} in it)"
            )


def read_model_state(directory: str | Path, model: torch.nn.Module) -> None:
    """Fill a plain (unsharded, materialised) model with the weights of a sharded checkpoint, in this process
    alone: no process group is needed, and the optimizer state is not read. The shards are checked first
    (``check_shards``); a read that still fails is a CheckpointError naming the directory."""
    check_shards(directory)
    root = Path(directory) / SHARDED_DIR
    state = {"model": model.state_dict()}
    try:
        with warnings.catch_warnings():  # "no process group: loading in one process" is what is meant here
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(root), no_dist=True)
    except Exception as error:  # DCP wraps a reader's failure in its own CheckpointException
        raise CheckpointError(f"{root}: unreadable ({type(error).__name__}: {first_line(error)})") from None
    try:
        model.load_state_dict(state["model"], strict=True)
    except RuntimeError as error:
        raise CheckpointError(f"{root}: does not hold the model's tensors ({first_line(error)})") from None
