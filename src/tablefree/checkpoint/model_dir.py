"""A model directory's files (layout in ``tablefree.checkpoint``): weights in safetensors, configuration and
meta in JSON; written here and read here. No pickle is ever loaded here.

``load_model`` is the one entry through which evaluation, export, generation and analysis read a model's
weights (full or sharded), so a check of what is read belongs in it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tablefree.checkpoint.layout import (
    COMPLETE_MARKER,
    CONFIG_FILE,
    META_FILE,
    MODEL_FILE,
    SHARDED_DIR,
    TOKENIZER_FILE,
    resolve_checkpoint,
)
from tablefree.config_parsing import from_dict, to_dict
from tablefree.device import resolve_device
from tablefree.fileio import atomic_path, read_json, write_json_atomic
from tablefree.model import TablefreeLM
from tablefree.model_config import ModelConfig
from tablefree.safetensors_header import check_model_weights


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
        write_safetensors_atomic(directory / MODEL_FILE, state)
    write_json_atomic(directory / CONFIG_FILE, config)
    write_json_atomic(directory / META_FILE, meta)
    if tokenizer_path is not None:
        shutil.copyfile(tokenizer_path, directory / TOKENIZER_FILE)


def write_safetensors_atomic(path: Path, state: dict[str, torch.Tensor]) -> None:
    """A safetensors file written under a hidden temporary name and renamed into place."""
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})


def mark_complete(directory: str | Path) -> None:
    write_json_atomic(Path(directory) / COMPLETE_MARKER, {"complete": True})


def read_model_config(checkpoint: str | Path) -> ModelConfig:
    directory = resolve_checkpoint(checkpoint)
    config = read_json(directory / CONFIG_FILE)
    if "model" not in config:
        raise ValueError(f"{directory / CONFIG_FILE}: missing the 'model' section")
    return from_dict(ModelConfig, config["model"], where=f"{directory / CONFIG_FILE}:model")


def empty_model(config: ModelConfig, device: str | torch.device = "cpu") -> TablefreeLM:
    """A model whose saved tensors are about to be loaded: built on the meta device and materialised without
    drawing random weights (all of which would be overwritten), with the fixed codes, which are not
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
    if not (directory / MODEL_FILE).exists() and (directory / SHARDED_DIR).is_dir():
        from tablefree.checkpoint.sharded import read_model_state  # DCP: imported only when read

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


def consolidate(directory: str | Path) -> Path:
    """Write the full weights of the sharded checkpoint ``directory`` as one ``model.safetensors`` beside it
    (atomically), the format of an unsharded checkpoint; returns its path."""
    from tablefree.checkpoint.sharded import read_model_state

    directory = Path(directory)
    model = empty_model(read_model_config(directory))
    read_model_state(directory, model)
    path = directory / MODEL_FILE
    write_safetensors_atomic(path, model_state(model))
    return path
