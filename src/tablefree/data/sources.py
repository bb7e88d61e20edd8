"""Finding a corpus's files: directories read recursively in sorted order, links followed, and every entry that
is not read named as junk with the reason (a dangling link, a link loop, a FIFO, device or socket, an unreadable
file or directory, a file or directory reached a second time through a link, a file of an unsupported type).
Only regular files are opened (:func:`open_regular`). A ``datasets`` DatasetDict folder is refused, naming its
splits: read whole, its splits would become one corpus."""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

KINDS = {".txt": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
# The metadata files `datasets`' save_to_disk writes beside its .arrow files: read by no one here, and not junk.
SAVE_TO_DISK_METADATA = ("dataset_info.json", "state.json")
# What a DatasetDict's save_to_disk writes beside one folder per split: such a folder is refused, not read whole.
DATASET_DICT_FILE = "dataset_dict.json"
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}


@dataclass(frozen=True)
class SourceFile:
    path: Path
    rel: str  # path relative to the corpus root it was found under: names the file in manifests and errors
    kind: str  # "txt", "jsonl", "parquet" or "arrow" (a `datasets` save_to_disk folder's Arrow IPC files)
    compression: str | None  # None, "gz" or "zst"


@dataclass
class Junk:
    """One piece of junk: a file (line ``None``) or a line/row of a file that was skipped, and why."""

    file: str
    line: int | None
    kind: str
    detail: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.kind}: {self.detail}"


# Junk items kept per file and kind; the rest are counted. At 100M documents with 1% bad lines every item would be
# a million objects in memory and in the manifest, where the first few of each say what is wrong.
MAX_JUNK_ITEMS = 20


class JunkLog:
    """The junk a reading found, in memory that does not grow with the corpus: the first ``MAX_JUNK_ITEMS`` items of
    each file and kind, in the order read, and the exact count of each file's items of each kind. A file's items
    come in the order of their positions in it, so the logs of consecutive pieces of the corpus, joined in order
    (:meth:`join`), keep the items one log of the whole keeps: what makes merged parts byte-identical to a single
    run. (Bytes that are not UTF-8 are capped per line the same way: ``decoding.BadCharacters``.)"""

    def __init__(self) -> None:
        self.items: list[Junk] = []
        self.counts: dict[str, dict[str, int]] = {}  # file -> kind -> items found
        self._kept: dict[tuple[str, str], int] = {}

    def add(self, junk: Junk) -> None:
        kinds = self.counts.setdefault(junk.file, {})
        kinds[junk.kind] = kinds.get(junk.kind, 0) + 1
        self._keep(junk)

    def join(self, items: Sequence[Junk], counts: dict[str, dict[str, int]] | None) -> None:
        """Append the log of the next piece of the corpus: its kept ``items`` and its ``counts`` (None: ``items`` are
        all it found, as a part written before counts were kept listed them)."""
        if counts is None:
            for junk in items:
                self.add(junk)
            return
        for junk in items:
            self._keep(junk)
        for file, kinds in counts.items():
            mine = self.counts.setdefault(file, {})
            for kind, count in kinds.items():
                mine[kind] = mine.get(kind, 0) + count

    def _keep(self, junk: Junk) -> None:
        key = (junk.file, junk.kind)
        if self._kept.get(key, 0) < MAX_JUNK_ITEMS:
            self._kept[key] = self._kept.get(key, 0) + 1
            self.items.append(junk)

    def __len__(self) -> int:
        """The items found (kept or only counted)."""
        return sum(count for kinds in self.counts.values() for count in kinds.values())

    def by_kind(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for kinds in self.counts.values():
            for kind, count in kinds.items():
                totals[kind] = totals.get(kind, 0) + count
        return dict(sorted(totals.items()))

    def as_dict(self) -> dict:
        """The manifest's record: counts by kind, the items kept, and counts by file and kind."""
        return {
            "junk": self.by_kind(),
            "junk_items": [dataclasses.asdict(junk) for junk in self.items],
            "junk_by_file": self.counts,
        }


class CorpusError(ValueError):
    """A corpus that cannot be read as asked; the message names the file (and line where there is one)."""


def list_sources(paths: str | Path | Sequence[str | Path]) -> tuple[list[SourceFile], list[Junk]]:
    """The corpus files under ``paths`` (directories recursively, sorted, links followed), and the junk found
    on the way: unsupported files and every entry that is not read, with the reason."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    walk = _Walk()
    for root in map(Path, paths):
        if not root.exists() and not root.is_symlink():
            raise FileNotFoundError(f"corpus path not found: {root}")
        # files of a directory are named relative to it; a file given directly, by its name
        walk.visit(root, "" if root.is_dir() else root.name, frozenset())
    return walk.files, walk.junk


class _Walk:
    """One listing of a corpus: the regular files found, and the junk (with its reason) for the rest."""

    def __init__(self) -> None:
        self.files: list[SourceFile] = []
        self.junk: list[Junk] = []
        self.seen: dict[tuple[int, int], str] = {}  # (device, inode) of each file and directory listed

    def visit(self, path: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        """List ``path``, named ``rel`` in the summary ("": a corpus root directory, named by its path)."""
        name = rel or str(path)
        try:
            info = path.stat()  # follows links
        except OSError as error:
            self.junk.append(_unreachable(path, name, error))
            return
        key = (info.st_dev, info.st_ino)
        if stat.S_ISDIR(info.st_mode):
            if key in ancestors:
                self.junk.append(
                    Junk(name, None, "link-loop", "a link back to a directory above it: not read")
                )
            elif key in self.seen:
                self.junk.append(
                    Junk(name, None, "duplicate", f"the directory {self.seen[key]} again: not read twice")
                )
            else:
                self.seen[key] = name
                self._directory(path, rel, ancestors | {key})
        elif not stat.S_ISREG(info.st_mode):
            kind = _file_kind(info.st_mode)
            self.junk.append(Junk(name, None, "not-regular", f"{kind}, not a regular file: not read"))
        elif key in self.seen:
            self.junk.append(Junk(rel, None, "duplicate", f"the file {self.seen[key]} again: not read twice"))
        else:
            self.seen[key] = rel
            kind, compression = file_type(path)
            if kind is None:
                self.junk.append(
                    Junk(rel, None, "unsupported", f"not .txt/.jsonl/.parquet/.arrow ({path.name})")
                )
            else:
                self.files.append(SourceFile(path, rel, kind, compression))

    def _directory(self, path: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        try:
            names = sorted(entry.name for entry in os.scandir(path))
        except OSError as error:
            detail = f"directory not listed ({error.strerror or error})"
            self.junk.append(Junk(rel or str(path), None, "unreadable", detail))
            return
        if DATASET_DICT_FILE in names:
            raise CorpusError(_dataset_dict_refusal(path, names))
        if "state.json" in names:  # a `datasets` save_to_disk folder
            names = [name for name in names if name not in SAVE_TO_DISK_METADATA]
        for name in names:  # sorted names at every level: the order of the sorted relative paths
            self.visit(path / name, f"{rel}/{name}" if rel else name, ancestors)


def _dataset_dict_refusal(path: Path, names: list[str]) -> str:
    """Why a DatasetDict's save_to_disk folder is not read: read whole, its splits would be one corpus (its test
    split in training)."""
    splits = [name for name in names if (path / name).is_dir()]
    wanted = "train" if "train" in splits else (splits[0] if splits else "SPLIT")
    return (
        f"{path}: a `datasets` DatasetDict folder ({DATASET_DICT_FILE}) holding the splits "
        f"{', '.join(splits) or '(none found)'}: read whole, they would all become one corpus (a test split in "
        f"training); give the split wanted, e.g. {path / wanted}"
    )


def _unreachable(path: Path, rel: str, error: OSError) -> Junk:
    if error.errno == errno.ELOOP:
        return Junk(rel, None, "link-loop", "links that lead back to each other: not read")
    if path.is_symlink() and isinstance(error, FileNotFoundError):
        return Junk(
            rel, None, "dangling-link", f"a link to {os.readlink(path)}, which does not exist: not read"
        )
    return Junk(rel, None, "unreadable", f"cannot be read ({error.strerror or error})")


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading, refused unless it is a regular file: a FIFO or a device (or a link to one,
    such as /dev/zero) would block the open or never end. O_NONBLOCK makes opening a FIFO return at once."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_file_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_type(path: Path) -> tuple[str | None, str | None]:
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = KINDS.get(suffixes[-1]) if suffixes else None
    if kind in ("parquet", "arrow") and compression:
        return None, None  # parquet compresses internally
    return kind, compression
