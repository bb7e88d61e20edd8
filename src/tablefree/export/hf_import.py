"""``import_hf``: a ``transformers`` model directory (Llama, or GPT-NeoX as exported here) -> a tablefree
checkpoint.

Everything is checked before a tensor is allocated: ``config.json`` against the safetensors headers (read without
loading a tensor): sizes whole numbers within bounds, every tensor present with the shape the config implies, no
truncated or malformed file (each refused naming the file). The recorded input interface is rebuilt and kept when
its ``adopt_table`` recognises the embedding matrix exactly; otherwise (or without a record) the matrix becomes a
``learned`` table, with a warning when a record was there.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tablefree.checkpoint.model_dir import empty_model, save_model
from tablefree.checkpoint.verify import check_finite
from tablefree.export.architectures import CONVERSIONS
from tablefree.export.layout import HF_INDEX, HF_WEIGHTS, INTERFACE_STATE_FILE, METADATA_KEY
from tablefree.fileio import read_json, staged_directory
from tablefree.interfaces import build_interface, parse_interface_options
from tablefree.interfaces.options import InterfaceConfig
from tablefree.model_config import ModelConfig
from tablefree.safetensors_header import TensorInfo, read_safetensors_header


def read_weight_headers(hf_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of ``model.safetensors`` or of the shards a ``model.safetensors.index.json`` lists."""
    single = hf_dir / HF_WEIGHTS
    if single.exists():
        return read_safetensors_header(single)
    index = hf_dir / HF_INDEX
    if not index.exists():
        raise FileNotFoundError(f"{hf_dir}: no {HF_WEIGHTS} or {HF_INDEX} (pickle is not read)")
    weight_map = _read_config_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index}: expected a 'weight_map' of tensor name -> file name")
    tensors: dict[str, TensorInfo] = {}
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name:
            raise ValueError(f"{index}: shard {name!r} is not a file name in {hf_dir}")
        if not (hf_dir / name).exists():
            raise FileNotFoundError(f"{index}: shard {name} is missing from {hf_dir}")
        tensors.update(read_safetensors_header(hf_dir / name))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ValueError(f"{index}: tensors listed but absent from their shards: {missing[:5]}")
    return tensors


def load_tensors(headers: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    """Load the (already checked) tensors, file by file; a read error, or a NaN or inf, names the file."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted({info.file for info in headers.values()}):
        try:
            loaded = load_file(str(path))
        except Exception as error:  # safetensors raises its own error types
            raise ValueError(f"{path}: cannot read the weights ({error})") from None
        check_finite(loaded, path)  # NaN or inf would be imported as if trained
        state.update(loaded)
    return state


def _read_config_json(path: Path) -> dict[str, Any]:
    data = read_json(
        path
    )  # malformed JSON, undecodable bytes and deep nesting are ValueErrors naming the file
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return data


def check_shapes(
    expected: dict[str, tuple[int, ...]],
    optional: set[str],
    headers: dict[str, TensorInfo],
    where: Path,
    sizes: str,
) -> None:
    """Every expected tensor present with the shape ``config.json`` implies; ``sizes`` names the fields."""
    for name, shape in expected.items():
        info = headers.get(name)
        if info is None:
            if name in optional:
                continue
            files = sorted({str(info.file) for info in headers.values()}) or [str(where.parent)]
            raise ValueError(f"{', '.join(files)}: weight {name!r} missing from the checkpoint")
        if info.shape != shape:
            raise ValueError(
                f"{info.file}: tensor {name!r} has shape {list(info.shape)}, but {where.name} ({sizes}) "
                f"implies {list(shape)}"
            )
        if not info.dtype.startswith(("F", "BF")):
            raise ValueError(f"{info.file}: tensor {name!r} has dtype {info.dtype}; expected floating point")


def import_hf(hf_dir: str | Path, out_checkpoint: str | Path, *, overwrite: bool = False) -> Path:
    """Load a ``LlamaForCausalLM`` (or GPT-NeoX, as exported here) directory into a tablefree checkpoint.

    Everything is checked before a tensor is allocated: ``config.json``'s sizes (whole numbers within
    ``SIZE_LIMITS``) against the safetensors headers (every tensor present, with the shape the config implies;
    no truncated file). The input interface recorded under ``"tablefree"`` is rebuilt and kept when its table
    equals the embedding matrix exactly; otherwise the matrix becomes a ``learned`` table (a warning says why
    when an interface was recorded). A tied output head (e.g. SmolLM2-135M) is copied into our untied head.
    """
    hf_dir, out_checkpoint = Path(hf_dir), Path(out_checkpoint)
    config_path = hf_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: not a transformers model directory (no config.json)")
    if out_checkpoint.exists() and any(out_checkpoint.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_checkpoint} exists and is not empty (pass overwrite=True / --overwrite)")
    hf_config = _read_config_json(config_path)
    model_type = hf_config.get("model_type")
    if model_type not in CONVERSIONS:
        raise ValueError(
            f"{config_path}: model_type {model_type!r} is not supported (expected llama or gpt_neox)"
        )
    conversion = CONVERSIONS[model_type](hf_config, config_path)
    headers = read_weight_headers(hf_dir)
    check_shapes(conversion.expected, conversion.optional, headers, config_path, conversion.sizes)
    metadata = hf_config.get(METADATA_KEY)
    metadata = metadata if isinstance(metadata, dict) else {}
    interface_state = read_interface_state(hf_dir, metadata, config_path)

    ours = conversion.convert(load_tensors(headers), config_path)
    config = conversion.config
    config.interface, interface_tensors = restore_interface(
        metadata, ours.pop("input.weight"), interface_state, config, config_path
    )
    model = empty_model(config)  # every tensor but the fixed codes is loaded below
    state = {k: v.float() for k, v in ours.items()} | {f"input.{k}": v for k, v in interface_tensors.items()}
    model.load_state_dict(state, strict=True)

    tokenizer = hf_dir / "tokenizer.json"
    meta = {
        "imported_from": str(hf_dir),
        "model_type": model_type,
        **{k: metadata[k] for k in ("step", "tokens_seen", "tokenizer_hash") if metadata.get(k) is not None},
    }
    with staged_directory(out_checkpoint) as staging:
        save_model(staging, model, meta=meta, tokenizer_path=tokenizer if tokenizer.exists() else None)
    return out_checkpoint


def read_interface_state(hf_dir: Path, metadata: dict[str, Any], where: Path) -> dict[str, torch.Tensor]:
    """The interface's own tensors recorded at export: ``tablefree_interface.safetensors`` (or, in exports of
    the first format, affine's A and b as lists in ``config.json``)."""
    name = metadata.get("interface_state")
    if name:
        if name != INTERFACE_STATE_FILE:
            raise ValueError(
                f"{where}: tablefree.interface_state: expected {INTERFACE_STATE_FILE!r}, got {name!r}"
            )
        path = hf_dir / name
        if not path.exists():
            raise FileNotFoundError(f"{where}: names {name}, which is missing from {hf_dir}")
        return load_tensors(read_safetensors_header(path))
    if "affine_matrix" in metadata and "affine_offset" in metadata:
        try:
            return {
                "affine_matrix": torch.tensor(metadata["affine_matrix"], dtype=torch.int64),
                "affine_offset": torch.tensor(metadata["affine_offset"], dtype=torch.int64),
            }
        except (TypeError, ValueError, OverflowError, RuntimeError):
            raise ValueError(
                f"{where}: tablefree.affine_matrix / affine_offset: expected 0/1 lists"
            ) from None
    return {}


def restore_interface(
    metadata: dict[str, Any],
    table: torch.Tensor,
    state: dict[str, torch.Tensor],
    config: ModelConfig,
    where: Path,
) -> tuple[InterfaceConfig, dict[str, torch.Tensor]]:
    """The recorded interface and its state when it recognises ``table`` (``adopt_table``), else ``learned``
    with the table as its weight."""
    learned = parse_interface_options("learned")
    if "interface" not in metadata:
        return learned, {"weight": table.float()}
    recorded = metadata["interface"]
    try:
        options = parse_interface_options(recorded, f"{where}:tablefree.interface")
    except ValueError as error:
        warnings.warn(f"{error}; the embedding matrix is imported as a learned table", stacklevel=3)
        return learned, {"weight": table.float()}
    interface = build_interface(options, config.vocab_size, config.d_model)
    try:
        adopted = interface.adopt_table(table, state)
    except (RuntimeError, ValueError) as error:  # missing or misshapen tensors, a singular affine matrix
        source = where.parent / INTERFACE_STATE_FILE if metadata.get("interface_state") else where
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{source}: the recorded {options.name} interface's state is invalid: {reason}"
        ) from None
    if adopted is None:
        warnings.warn(
            f"{where}: the embedding matrix is not the table of the recorded {options.name!r} interface (it was "
            "changed after export); imported as a learned table",
            stacklevel=3,
        )
        return learned, {"weight": table.float()}
    return options, adopted
