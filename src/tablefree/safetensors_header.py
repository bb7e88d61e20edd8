"""Safetensors files read from their header alone: names, dtypes and shapes, checked against the file's size,
so that a truncated or malformed file, or weights that disagree with a config, are refused naming the file before
any tensor is allocated (import-hf, and loading a tablefree checkpoint)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as a safetensors header describes it (nothing read but the header)."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of a safetensors file from its header alone; a truncated or malformed file is a ValueError
    naming it (every tensor's bytes must lie inside the file and match its dtype and shape)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if length < 2 or length > min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(
                    f"{path}: not a complete safetensors file (header length {length}, file of {size} bytes; "
                    "truncated?)"
                )
            header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: malformed safetensors header ({type(error).__name__})") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror or error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: malformed safetensors header (not a mapping)")
    data_bytes = size - 8 - length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_info(path, name, info, data_bytes)
    return tensors


def _tensor_info(path: Path, name: str, info: Any, data_bytes: int) -> TensorInfo:
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: tensor {name!r}: {why}")

    if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPE_BYTES:
        raise bad(f"unknown dtype {info.get('dtype') if isinstance(info, dict) else info!r}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(is_count(n, allow_zero=True) for n in shape):
        raise bad(f"malformed shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(n, True) for n in offsets)):
        raise bad(f"malformed data_offsets {offsets!r}")
    start, end = offsets
    expected = math.prod(shape) * SAFETENSORS_DTYPE_BYTES[info["dtype"]]
    if end - start != expected:
        raise bad(f"holds {end - start} bytes, but shape {shape} of {info['dtype']} needs {expected}")
    if end > data_bytes:
        raise bad(f"ends at byte {end} of the data, which has only {data_bytes} bytes (truncated file?)")
    return TensorInfo(path, info["dtype"], tuple(shape))


def is_count(value: Any, allow_zero: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= (0 if allow_zero else 1)
