"""Verifying a checkpoint before it is used: the one set of checks every reader runs (``train --resume``
through ``training.load_for_resume``; ``eval``, ``export``, ``generate``, ``analyze`` and the lm-eval adapter
through ``model_dir.load_model``; ``import-hf`` applies the header and finiteness checks to a transformers
directory). Each failure is a ``CheckpointError`` naming the file and the check.

- digests: every file listed in ``COMPLETE`` must hash to its recorded sha256, and ``COMPLETE`` must list
  them (a marker without digests fails). A symlinked file is resolved and hashed like any other, so a link to
  another checkpoint's file fails unless it holds exactly the bytes recorded;
- JSON: ``COMPLETE``, ``config.json`` and ``meta.json`` must hold JSON objects;
- the weights header, before any tensor is allocated: the bytes the config's model needs bounded by the file's
  size, then every tensor's name, shape and dtype as the config's model has them (an F32 tensor relabelled I32,
  or F16 weights in an fp32 checkpoint, are refused);
- finite weights, after loading (training never saves NaN or inf).

Digests and the finiteness check are the costly part (docs/reliability.md gives the cost); ``verify=False``
(``--no-verify``) skips those two and keeps the structural checks, which cost next to nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tablefree.checkpoint.layout import COMPLETE_MARKER, CheckpointError, first_line
from tablefree.fileio import read_json, sha256_file
from tablefree.safetensors_header import SAFETENSORS_DTYPE_BYTES, read_safetensors_header

SAFETENSORS_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.int64: "I64", torch.float64: "F64",
}  # fmt: skip


def read_json_object(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file that must hold an object; anything else is a CheckpointError naming it."""
    try:
        data = read_json(path)
    except (ValueError, OSError, RecursionError) as error:
        raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found a JSON {type(data).__name__}")
    return data


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint directory, sharded/ included, by relative path (COMPLETE aside)."""
    return {
        path.relative_to(directory).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != COMPLETE_MARKER
    }


def verify_digests(directory: str | Path, only: tuple[str, ...] | None = None) -> None:
    """Check each file (or those named in ``only``) against the sha256 recorded in COMPLETE. A COMPLETE that
    records no digests fails: nothing would then tell a damaged file from an intact one."""
    directory = Path(directory)
    marker = directory / COMPLETE_MARKER
    digests = read_json_object(marker).get("sha256")
    if digests is None:
        raise CheckpointError(
            f"{marker}: records no sha256 digests, so the files cannot be verified (pass --no-verify / "
            "verify=False to read it unverified)"
        )
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise CheckpointError(f"{marker}: 'sha256' should map file names to hex digests")
    for name, expected in digests.items():
        if only is not None and name not in only:
            continue
        relative = Path(str(name))
        if relative.is_absolute() or ".." in relative.parts:
            raise CheckpointError(f"{marker}: {name!r} is not a file of the checkpoint")
        path = directory / relative
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {COMPLETE_MARKER})")
        if sha256_file(path) != expected:
            link = f" (a symbolic link to {path.resolve()})" if path.is_symlink() else ""
            raise CheckpointError(
                f"{path}{link}: damaged after it was written (its sha256 differs from the one recorded in "
                f"{COMPLETE_MARKER})"
            )


def expected_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype) of a state dict (meta tensors and DTensors alike: nothing is read)."""
    return {
        name: (tuple(t.shape), SAFETENSORS_DTYPES.get(t.dtype, str(t.dtype))) for name, t in state.items()
    }


def check_weights_header(
    path: Path, expected: dict[str, tuple[tuple[int, ...], str]], config_path: Path
) -> None:
    """Before any tensor is allocated, from the header alone: exactly the model's tensors, each of the dtype
    the model holds and of the shape the config implies. The header's offsets lie inside the file
    (``read_safetensors_header``), so the config's sizes are bounded by the file's; a config claiming a
    larger model is refused naming both sizes."""
    try:
        headers = read_safetensors_header(path)
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    missing = sorted(expected.keys() - headers.keys())
    unexpected = sorted(headers.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: does not hold the tensors of the model in {config_path.name}"
            + (f"; missing {', '.join(missing[:3])}" if missing else "")
            + (f"; unexpected {', '.join(unexpected[:3])}" if unexpected else "")
        )
    for name, (_, dtype) in expected.items():
        if headers[name].dtype != dtype:
            raise CheckpointError(
                f"{path}: tensor {name!r} is {headers[name].dtype}, but the checkpoint's model holds {dtype}"
            )
    needed = sum(_count(shape) * SAFETENSORS_DTYPE_BYTES.get(dtype, 4) for shape, dtype in expected.values())
    size = path.stat().st_size
    bound = (
        f" ({config_path.name} describes a model of {needed:,} bytes of weights; the file holds {size:,})"
        if needed > size
        else ""
    )
    for name, (shape, _) in expected.items():
        if headers[name].shape != shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {list(headers[name].shape)}, but {config_path.name} "
                f"implies {list(shape)}{bound}"
            )


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def non_finite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding NaN or inf (DTensors: each process checks its own shards)."""
    poisoned = []
    for name, tensor in state.items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
            poisoned.append(name)
    return poisoned


def check_finite(state: Mapping[str, torch.Tensor], path: Path) -> None:
    poisoned = non_finite_tensors(state)
    if poisoned:
        raise CheckpointError(
            f"{path}: non-finite weights (NaN or inf) in {', '.join(poisoned[:3])}"
            + (f" and {len(poisoned) - 3} more" if len(poisoned) > 3 else "")
        )
