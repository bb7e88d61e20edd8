"""Atomic writes, strict JSON and file digests, for every file tablefree writes.

Every output is written atomically: a synced temp file (``.NAME.tmp.PID``) renamed into place, so a reader (or a
crash) never sees a half-written file that looks whole; ``atomic_path`` serves writers that need a path (safetensors,
tokenizers, matplotlib), ``staged_directory`` whole directories. JSON is written strict (``strict_json``: no NaN)
and read with the file and line of any error, a key twice included (``read_json``, with an explicit choice for a
missing file). A full disk is one ``DiskFullError`` naming the mount and the file (``writing``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import json.scanner
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

RAISE: Any = object()  # read_json's default for a missing file: FileNotFoundError


class DiskFullError(OSError):
    """A write failed for want of space: "no space left on MOUNT while writing FILE" (errno ENOSPC)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(
            errno.ENOSPC, f"no space left on {_mount_point(Path(path))} while writing {path}", str(path)
        )

    def __str__(self) -> str:
        return self.strerror


def _mount_point(path: Path) -> str:
    path = path.absolute()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return str(path)


def _out_of_space(error: BaseException, path: Path) -> bool:
    """ENOSPC, also from libraries that drop the errno (safetensors says "os error 28"; torch.save only that a
    write failed): then the file system's free space, nearly none left, tells."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    if "os error 28" in str(error) or "No space left on device" in str(error):
        return True
    directory = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        stats = os.statvfs(directory)
    except (OSError, TypeError):
        return False
    return stats.f_bavail * stats.f_frsize < 1 << 20


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Around the writes of ``path`` (a file or a directory being assembled): a full disk becomes one clear
    DiskFullError naming the mount and the file, whatever the writer raised."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        if _out_of_space(error, Path(path)):
            raise DiskFullError(path) from error
        raise


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temp path beside ``path`` to write to; when the block succeeds the file is synced and renamed into place,
    on an error it is removed. ``suffix`` ends the temp name, for writers that infer the format from it."""
    path = Path(path)
    # .NAME.tmp.PID: the pattern prepare's restart cleanup removes after a kill; open() (unlike mkstemp)
    # gives the file the usual umask permissions
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}{suffix}")
    try:
        with writing(path):
            yield tmp
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a synced temp file and a rename; the temp file is removed on error."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a synced temp file and a rename."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def strict_json(value: Any) -> Any:
    """``value`` as strict JSON data: every NaN/inf float as None (strict JSON has no NaN, and a bare ``NaN``
    breaks other readers), numpy scalars as Python numbers, paths as strings, tuples as lists, keys as strings."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy (or 0-d torch) scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


class DuplicateKeyError(ValueError):
    """A JSON object names a key twice."""


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads(..., object_pairs_hook=no_duplicate_keys)``: an object that names a key twice is a
    DuplicateKeyError naming the key (plain ``json`` keeps the last value and drops the first without a word)."""
    record = dict(pairs)
    if len(record) < len(pairs):
        seen: set[str] = set()
        key = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise DuplicateKeyError(f"duplicate key {key!r}")
    return record


def _object_line(text: str) -> int | None:
    """The line where the object with a duplicate key starts (the error path of ``read_json``: the pure-Python
    scanner, unlike the C one, lets a wrapper see where each object starts)."""
    starts: list[int] = []
    decoder = json.JSONDecoder(object_pairs_hook=no_duplicate_keys)

    def parse_object(s_and_end, *args):
        try:
            return json.decoder.JSONObject(s_and_end, *args)
        except DuplicateKeyError:
            starts.append(s_and_end[1])  # the innermost object fails first
            raise

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    with contextlib.suppress(ValueError, RecursionError):
        decoder.decode(text)
    return text.count("\n", 0, starts[0]) + 1 if starts else None


def read_json(path: str | Path, default: Any = RAISE) -> Any:
    """A JSON file; malformed JSON (also bytes that are not UTF-8, nesting too deep for the parser, integers
    over Python's 4,300-digit limit, a key twice in one object) is a ValueError that names the file, and the line
    where there is one. A missing file is a FileNotFoundError, or ``default`` when one is given."""
    path = Path(path)
    if default is not RAISE and not path.exists():
        return default
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}: malformed JSON (bytes that are not UTF-8 at line {line})") from None
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: malformed JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: malformed JSON (nested too deeply)") from None
    except DuplicateKeyError as error:
        line = _object_line(text)
        raise ValueError(
            f"{path}: {error} in the object starting at line {line} (a key may appear once)"
        ) from None
    except ValueError as error:  # e.g. an integer over the 4,300-digit limit of int()
        raise ValueError(f"{path}: malformed JSON ({str(error)[:200]})") from None


@contextlib.contextmanager
def staged_directory(path: str | Path) -> Iterator[Path]:
    """Build a directory under a hidden temporary name (``.NAME.tmp.PID``, usual permissions) and rename it
    into place whole when the block succeeds, replacing what was at ``path``; on an error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sha256_file(path: str | Path) -> str:
    """The file's sha256 as hex, read in 16 MiB blocks (shards, checkpoints and benchmark files alike)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def try_pid_lock(path: str | Path) -> tuple[IO[str] | None, str]:
    """An exclusive ``flock`` on ``path`` with this process's pid written in it: (the open file, which holds the
    lock until it is closed; the kernel releases it however the process exits), or (None, the holder's pid as
    written, "unknown" if none) when another process holds it."""
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (returned open: the caller holds the lock)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return None, holder
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle, str(os.getpid())
