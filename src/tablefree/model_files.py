"""Model files of a checkpoint: weights in safetensors, configuration in JSON. No pickle is ever loaded here.

A checkpoint is a directory::

    step_000100/
        model.safetensors   # weights and the fixed interfaces' persistent buffers (A and b for affine)
        config.json         # {"model": ModelConfig as a dict, ...the rest of the run config}
        tokenizer.json      # the tokenizer the model was trained with (when known)
        meta.json           # step, tokens seen, tokenizer hash, ...
        COMPLETE            # written last: a directory without it is not a checkpoint

Training adds its own state next to these (see ``tablefree.train.checkpoints``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tablefree.config_parsing import from_dict, to_dict
from tablefree.device import resolve_device
from tablefree.fileio import read_json, write_json_atomic
from tablefree.model import TablefreeLM
from tablefree.model_config import ModelConfig
from tablefree.safetensors_header import check_model_weights

COMPLETE_MARKER = "COMPLETE"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state to save: parameters and persistent buffers, contiguous and detached."""
    return {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()}


def save_model_files(
    directory: str | Path,
    state: dict[str, torch.Tensor] | None,
    config: dict[str, Any],
    meta: dict[str, Any],
    tokenizer_path: str | Path | None = None,
) -> None:
    """Write the model files into ``directory`` (which the caller later marks COMPLETE). ``state`` None: the
    weights are already there in another form (a sharded training checkpoint's ``sharded/``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if state is not None:
        tmp = directory / f".{MODEL_FILE}.tmp"
        save_file(state, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, directory / MODEL_FILE)
    write_json_atomic(directory / CONFIG_FILE, config)
    write_json_atomic(directory / META_FILE, meta)
    if tokenizer_path is not None:
        shutil.copyfile(tokenizer_path, directory / TOKENIZER_FILE)


def mark_complete(directory: str | Path) -> None:
    write_json_atomic(Path(directory) / COMPLETE_MARKER, {"complete": True})


def is_complete(directory: str | Path) -> bool:
    return (Path(directory) / COMPLETE_MARKER).exists()


def complete_steps(parent: str | Path) -> list[Path]:
    """The complete ``step_*`` checkpoint directories directly under ``parent``, oldest first."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.glob("step_*") if p.is_dir() and is_complete(p))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint, a run directory, or a directory of ``step_*`` checkpoints:
    the newest complete one."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if is_complete(path):
        return path
    for parent in (path / "checkpoints", path):
        steps = complete_steps(parent)
        if steps:
            return steps[-1]
    raise FileNotFoundError(
        f"{path}: no complete checkpoint (a step_* directory with a {COMPLETE_MARKER} marker)"
    )


def read_model_config(checkpoint: str | Path) -> ModelConfig:
    directory = resolve_checkpoint(checkpoint)
    config = read_json(directory / CONFIG_FILE)
    if "model" not in config:
        raise ValueError(f"{directory / CONFIG_FILE}: missing the 'model' section")
    return from_dict(ModelConfig, config["model"], where=f"{directory / CONFIG_FILE}:model")


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device; ``tablefree.device.resolve_device`` (kept under this name for callers)."""
    return resolve_device(device)


def empty_model(config: ModelConfig, device: str | torch.device = "cpu") -> TablefreeLM:
    """A model whose saved tensors are about to be loaded: built on the meta device and materialised without
    drawing random weights (21.8 s of CPU at paper-1.7b, all overwritten), with the fixed codes, which are not
    saved, recomputed from their options."""
    with torch.device("meta"):
        model = TablefreeLM(config)
    model.to_empty(device=device)
    model.input.reset_fixed_state()
    return model


def load_model(checkpoint: str | Path, device: str | torch.device = "cpu") -> tuple[TablefreeLM, Path]:
    """Load a model for inference: (model in eval mode, the resolved checkpoint directory)."""
    device = resolve_device(device)
    directory = resolve_checkpoint(checkpoint)
    model = empty_model(read_model_config(directory), device)
    if not (directory / MODEL_FILE).exists() and (directory / "sharded").is_dir():
        from tablefree.train.sharded import read_model_state  # a sharded (DCP) training checkpoint

        read_model_state(directory, model)
        return model.eval(), directory
    # Sizes and a truncated file are checked from the header before the weights are read.
    check_model_weights(directory / MODEL_FILE, model, directory / CONFIG_FILE)
    state = load_file(str(directory / MODEL_FILE), device=str(device))
    model.load_state_dict(state, strict=True)
    return model.eval(), directory


def save_model(
    directory: str | Path,
    model: TablefreeLM,
    meta: dict[str, Any] | None = None,
    tokenizer_path: str | Path | None = None,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Save a model alone as a complete checkpoint directory (used by tests, import and export)."""
    config = {"model": to_dict(model.config), **(extra_config or {})}
    save_model_files(directory, model_state(model), config, meta or {}, tokenizer_path)
    mark_complete(directory)
    return Path(directory)
