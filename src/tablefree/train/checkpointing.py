"""Training checkpoints: model files per ``tablefree.checkpoint`` plus the state needed to resume exactly.

Layout of a run's checkpoints::

    checkpoints/step_00000100/
        model.safetensors   # full (unsharded) weights, names as in TablefreeLM
        config.json         # {"model": ..., "train": the resolved TrainConfig}
        tokenizer.json      # copied from the dataset
        meta.json           # step, tokens_seen, tokenizer_hash, data_dir, ...
        train_state.pt      # TrainState, optimizer (keyed by parameter name), RNG states, loader position
        COMPLETE            # written last

A step directory is assembled under a hidden temporary name, marked COMPLETE, then renamed into place, so a
``step_*`` directory is always whole. ``train_state.pt`` is written with ``torch.save`` and read only with
``torch.load(weights_only=True)``: tensors, numbers, strings and containers, never pickled code.

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict`` with full state dicts, so the
same files come from (and load into) one process, DDP or FSDP2 at any world size.
"""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from tablefree.checkpoint import MODEL_FILE, complete_steps, is_complete, mark_complete, save_model_files

TRAIN_STATE_FILE = "train_state.pt"
CHECKPOINTS_DIR = "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete step directories of a run, oldest first."""
    return complete_steps(Path(run_dir) / CHECKPOINTS_DIR)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full, unsharded model and optimizer state on CPU, keyed by parameter name (a collective under FSDP2:
    every process must call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return model_state, optim_state


def rng_state() -> dict[str, Any]:
    """Every random generator's state, as tensors and plain values (loadable with weights_only=True)."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def staging_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is assembled before it is renamed into place (the same path on every
    process: the ranks of a sharded save write their shards there first)."""
    return Path(run_dir) / CHECKPOINTS_DIR / f".{step_dir_name(step)}.tmp"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor] | None,
    train_state: dict[str, Any],
    config: dict[str, Any],
    meta: dict[str, Any],
    tokenizer_path: str | Path | None,
    keep_last: int = 0,
) -> Path:
    """Write a complete step directory (call on the main process only) and prune old ones. ``model_state``
    None: a sharded checkpoint, whose model and optimizer shards every process has already written into
    ``staging_dir`` (``tablefree.train.sharded.save_sharded``)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = staging_dir(run_dir, step)
    if model_state is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # left over from a process killed while saving
    save_model_files(tmp, model_state, config, meta, tokenizer_path)
    torch.save(train_state, tmp / TRAIN_STATE_FILE)
    mark_complete(tmp)
    if final.exists():  # the same step saved again (e.g. a resumed run stopped at once)
        shutil.rmtree(final)
    tmp.rename(final)
    prune_checkpoints(run_dir, keep_last)
    return final


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all) and any incomplete ones."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    for stale in root.glob("step_*"):
        if stale.is_dir() and not is_complete(stale):
            shutil.rmtree(stale, ignore_errors=True)
    if keep_last > 0:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def load_train_state(directory: str | Path) -> dict[str, Any]:
    """``train_state.pt`` of a checkpoint, unpickled with ``weights_only=True``: anything but tensors and plain
    data (a pickled object whose ``__reduce__`` would run code) is refused before it can run."""
    path = Path(directory) / TRAIN_STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; {directory} is a model checkpoint without training state")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path}: refused to load: it holds something other than tensors and plain data ({error})"
        ) from None


def load_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(directory) / MODEL_FILE), device="cpu")


def restore(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
) -> None:
    """Load full model and optimizer state into a (possibly sharded or wrapped) model on every process."""
    options = StateDictOptions(full_state_dict=True, strict=True)
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=options
    )
