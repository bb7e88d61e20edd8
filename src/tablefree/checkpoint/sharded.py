"""Sharded training checkpoints with ``torch.distributed.checkpoint`` (DCP), as torchtitan saves them.

Under FSDP2 with several processes a full checkpoint gathers every weight and Adam moment to rank 0 when it is
saved and makes every rank read all of it when it resumes (for ``paper-1.7b`` on 8 ranks: about 8 × 21 GB of host
memory). A sharded checkpoint instead has each rank write and read only its own shards::

    checkpoints/step_00000100/
        sharded/            # DCP: .metadata + one __<rank>_0.distcp file per rank, model and optimizer state
        config.json  tokenizer.json  meta.json  train_state.pt (no optimizer: it is in sharded/)  COMPLETE

DCP reshards on load, so such a checkpoint resumes at any world size, with FSDP2, DDP or one process. For
inference it is read in one process without a process group (``read_model_state``): ``tablefree eval``,
``export`` and ``generate`` take it as they take a full checkpoint, and ``model_dir.consolidate`` writes the
usual single ``model.safetensors`` beside it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tablefree.checkpoint.layout import SHARDED_DIR


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


def read_model_state(directory: str | Path, model: torch.nn.Module) -> None:
    """Fill a plain (unsharded, materialised) model with the weights of a sharded checkpoint, in this process
    alone: no process group is needed, and the optimizer state is not read."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "no process group: loading in one process" is what is meant here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(Path(directory) / SHARDED_DIR), no_dist=True)
    model.load_state_dict(state["model"], strict=True)
