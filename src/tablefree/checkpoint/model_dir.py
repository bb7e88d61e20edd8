"""A model directory's files (layout in ``tablefree.checkpoint``): weights in safetensors, configuration and
meta in JSON; written here and read here. No pickle is ever loaded here.

``load_model`` is the one entry through which evaluation, export, generation, analysis and the lm-eval adapter
read a model's weights (full or sharded), so a check of what is read belongs in it; ``weights_provenance`` is
the one hash of those weights that an export records.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
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
    CheckpointError,
    checkpoint_candidates,
    first_line,
    resolve_checkpoint,
)
from tablefree.checkpoint.verify import (
    check_finite,
    check_weights_header,
    expected_tensors,
    file_digests,
    read_json_object,
    verify_digests,
)
from tablefree.config_parsing import from_dict, to_dict
from tablefree.device import resolve_device
from tablefree.fileio import atomic_path, sha256_file, write_json_atomic
from tablefree.model import TablefreeLM
from tablefree.model_config import ModelConfig


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
    """Written last, with every file's sha256, which each reader verifies (``checkpoint.verify``)."""
    directory = Path(directory)
    write_json_atomic(directory / COMPLETE_MARKER, {"complete": True, "sha256": file_digests(directory)})


def read_model_config(checkpoint: str | Path) -> ModelConfig:
    """The ModelConfig of a checkpoint (or of the newest one of a run); a config.json that is not a JSON object
    with a valid 'model' section is a CheckpointError naming it."""
    path = resolve_checkpoint(checkpoint) / CONFIG_FILE
    config = read_json_object(path)
    if "model" not in config:
        raise CheckpointError(f"{path}: missing the 'model' section")
    try:
        return from_dict(ModelConfig, config["model"], where=f"{path}:model")
    except ValueError as error:
        raise CheckpointError(first_line(error)) from None


def empty_model(config: ModelConfig, device: str | torch.device = "cpu") -> TablefreeLM:
    """A model whose saved tensors are about to be loaded: built on the meta device and materialised without
    drawing random weights (all of which would be overwritten), with the fixed codes, which are not
    saved, recomputed from their options."""
    with torch.device("meta"):
        model = TablefreeLM(config)
    return _materialise(model, device)


def _materialise(model: TablefreeLM, device: str | torch.device) -> TablefreeLM:
    model.to_empty(device=device)
    model.input.reset_fixed_state()
    return model


def load_model(
    checkpoint: str | Path, device: str | torch.device = "cpu", verify: bool = True
) -> tuple[TablefreeLM, Path]:
    """Load a model for inference: (model in eval mode, the checkpoint directory read), verified per
    ``checkpoint.verify``. A checkpoint directory that fails is refused (a CheckpointError naming the file and
    the check); given a run directory (or a directory of ``step_*`` checkpoints), the newest checkpoint that
    verifies is used, and each one skipped on the way is named on stderr. ``verify=False`` (``--no-verify``)
    skips the digests and the finiteness check, and says so on stderr."""
    device = resolve_device(device)
    candidates = checkpoint_candidates(checkpoint)
    if not verify:
        print(
            f"tablefree: --no-verify: {candidates[0]}: sha256 digests and the finite-weights check skipped",
            file=sys.stderr,
        )
    failures: list[tuple[Path, CheckpointError]] = []
    for directory in candidates:
        try:
            model = _load_verified(directory, device, verify)
        except CheckpointError as error:
            if len(candidates) == 1:
                raise
            failures.append((directory, error))
            continue
        for skipped, error in failures:
            print(f"tablefree: skipped {skipped.name}, which fails verification: {error}", file=sys.stderr)
        if failures:
            print(f"tablefree: using {directory}, the newest checkpoint that verifies", file=sys.stderr)
        return model.eval(), directory
    reasons = "; ".join(f"{directory.name}: {error}" for directory, error in failures)
    raise CheckpointError(f"{checkpoint}: no checkpoint verifies ({reasons})")


def _load_verified(directory: Path, device: torch.device, verify: bool) -> TablefreeLM:
    """One checkpoint, checked before anything is allocated (digests, JSON, the weights header against the
    config), then loaded and (``verify``) checked for non-finite weights."""
    if verify:
        verify_digests(directory)
    if (directory / META_FILE).exists():
        read_json_object(directory / META_FILE)  # readers take fields from it later
    config = read_model_config(directory)
    with torch.device("meta"):
        model = TablefreeLM(config)
    if not (directory / MODEL_FILE).exists():
        if not (directory / SHARDED_DIR).is_dir():
            raise CheckpointError(
                f"{directory}: holds neither {MODEL_FILE} nor {SHARDED_DIR}/ (the weights of a full or a "
                "sharded checkpoint)"
            )
        # DCP (slow to import) only when a sharded checkpoint is read: every verb loads this module
        from tablefree.checkpoint.sharded import read_model_state

        model = _materialise(model, device)
        read_model_state(directory, model)
        if verify:
            check_finite(dict(model.named_parameters()), directory / SHARDED_DIR)
        return model
    check_weights_header(
        directory / MODEL_FILE, expected_tensors(model.state_dict()), directory / CONFIG_FILE
    )
    model = _materialise(model, device)
    try:
        state = load_file(str(directory / MODEL_FILE), device=str(device))
    except Exception as error:  # safetensors raises its own SafetensorError, or OSError
        raise CheckpointError(
            f"{directory / MODEL_FILE}: unreadable ({type(error).__name__}: {first_line(error)})"
        ) from None
    if verify:
        check_finite(state, directory / MODEL_FILE)
    model.load_state_dict(state, strict=True)
    return model


def weights_provenance(directory: str | Path) -> dict[str, Any]:
    """What identifies the weights a checkpoint holds, hashed now from the files themselves: a full
    checkpoint's ``model.safetensors`` (its sha256), or a sharded one's ``sharded/`` (the sha256 of the sorted
    "digest  relative path" lines of its DCP metadata and shard files, each file's digest listed too)."""
    directory = Path(directory)
    if (directory / MODEL_FILE).exists():
        return {
            "source_weights_format": "safetensors",
            "source_weights_sha256": sha256_file(directory / MODEL_FILE),
        }
    from tablefree.checkpoint.sharded import shard_files  # DCP: imported only when read

    files = {path.relative_to(directory).as_posix(): sha256_file(path) for path in shard_files(directory)}
    if not files:
        raise CheckpointError(f"{directory}: holds neither {MODEL_FILE} nor the files of {SHARDED_DIR}/")
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(files.items()))
    return {
        "source_weights_format": "dcp",
        "source_weights_sha256": hashlib.sha256(listing.encode()).hexdigest(),
        "source_weights_files": files,
    }


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
