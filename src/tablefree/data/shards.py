"""Token shards in the llm.c / modded-nanogpt format.

A shard is a 256 × int32 little-endian header — magic 20240520, version, token count — followed by the tokens:
version 1 stores uint16 tokens (V ≤ 65,536, readable by llm.c and modded-nanogpt), version 2 (ours) stores
uint32 tokens for larger vocabularies. Shards are written to a temporary file and renamed into place, so a
shard that exists is whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tablefree.fileio import atomic_path

MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
VERSION_UINT16 = 1
VERSION_UINT32 = 2
_DTYPES = {VERSION_UINT16: np.dtype("<u2"), VERSION_UINT32: np.dtype("<u4")}


def version_for_vocab(vocab_size: int) -> int:
    return VERSION_UINT16 if vocab_size <= 65_536 else VERSION_UINT32


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The dtype a shard of this vocabulary stores its tokens in (uint16 up to 65,536 ids, else uint32)."""
    return _DTYPES[version_for_vocab(vocab_size)]


def write_shard(path: str | Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Atomically write ``tokens`` as a shard (temp file in the same directory, fsync, rename)."""
    path = Path(path)
    version = version_for_vocab(vocab_size)
    dtype = _DTYPES[version]
    tokens = np.asarray(tokens)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"{path}: token ids must lie in [0, {vocab_size})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, version, tokens.size)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(header.tobytes())
        handle.write(tokens.astype(dtype, copy=False).tobytes())


def read_header(path: str | Path) -> tuple[int, int]:
    """(version, token count) of a shard; errors name the file and what was expected."""
    path = Path(path)
    with open(path, "rb") as handle:
        raw = handle.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: truncated shard header ({len(raw)} of {HEADER_BYTES} bytes)")
    header = np.frombuffer(raw, dtype="<i4")
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic != MAGIC:
        raise ValueError(f"{path}: not a token shard (magic {magic}, expected {MAGIC})")
    if version not in _DTYPES:
        raise ValueError(f"{path}: unsupported shard version {version}; expected 1 (uint16) or 2 (uint32)")
    expected = HEADER_BYTES + count * _DTYPES[version].itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise ValueError(
            f"{path}: size {actual} bytes does not match the header's {count} tokens ({expected} bytes)"
        )
    return version, count


def open_shard(path: str | Path) -> np.memmap:
    """Memory-map a shard's tokens (read-only; no copy into RAM)."""
    version, count = read_header(path)
    return np.memmap(path, dtype=_DTYPES[version], mode="r", offset=HEADER_BYTES, shape=(count,))
