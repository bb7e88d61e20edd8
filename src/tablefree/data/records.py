"""One typed reader for the JSON records of data preparation: each record is a dataclass, and
:func:`parse_record` checks a parsed JSON value against its type hints (strictly: a count is a non-negative
integer, never a bool or a string), names the first field that is wrong and what was expected, then runs the
record's own ``check`` for what types cannot say (a part number within its count, one start per document).
Keys a record does not name are ignored, so a newer writer's extra fields do not stop an older reader."""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tablefree.data.corpus import PieceInfo
from tablefree.data.documents import SPLITS
from tablefree.data.sources import Junk
from tablefree.fileio import read_json

T = TypeVar("T")
Signed = typing.NewType("Signed", int)  # an integer that may be -1 (a cursor before the first document)


class RecordError(ValueError):
    """A record that is not of its type; the message names the file and the field."""


def read_record(cls: type[T], path: str | Path, advice: str) -> T:
    """The record of type ``cls`` in JSON file ``path``; ``advice`` ends every error (what to do about it)."""
    return parse_record(cls, read_json(path), path, advice)


def parse_record(cls: type[T], value: object, path: str | Path, advice: str) -> T:
    def fail(where: str, expected: str) -> typing.NoReturn:
        raise RecordError(f"{path}: field {where or '(top level)'!r} {expected}; {advice}")

    record = _parse(cls, value, "", fail)
    check = getattr(record, "check", None)
    if check is not None:
        check(fail)
    return record


def _parse(hint: Any, value: object, where: str, fail: Callable[[str, str], typing.NoReturn]) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not type(None)]
        if value is None and len(options) < len(typing.get_args(hint)):
            return None
        return _parse(options[0], value, where, fail)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            fail(where, f"must be an object ({hint.__name__})")
        hints = typing.get_type_hints(hint)
        kwargs = {}
        for spec in dataclasses.fields(hint):
            name = f"{where}.{spec.name}" if where else spec.name
            if spec.name in value:
                kwargs[spec.name] = _parse(hints[spec.name], value[spec.name], name, fail)
            elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                fail(name, "is missing")
        return hint(**kwargs)
    if origin is list:
        if not isinstance(value, list):
            fail(where, "must be a list")
        (item,) = typing.get_args(hint)
        return [_parse(item, v, f"{where}[{i}]", fail) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            fail(where, "must be an object")
        _, item = typing.get_args(hint)
        return {k: _parse(item, v, f"{where}.{k}", fail) for k, v in value.items()}
    if hint is Signed:
        if not (isinstance(value, int) and not isinstance(value, bool) and -1 <= value < 2**62):
            fail(where, f"must be an integer of at least -1, not {value!r}")
        return value
    if hint is int:
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62):
            fail(where, f"must be a count (a non-negative integer), not {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            fail(where, f"must be a string, not {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            fail(where, f"must be true or false, not {value!r}")
        return value
    return value  # Any


@dataclass(frozen=True)
class PartSplit:
    """One split's token file of a part: its tokens, documents, sha256; for val also each document's start in the
    file, its record (where its text came from) and the documents the cap left out."""

    file: str
    tokens: int
    documents: int
    sha256: str
    starts: list[int] | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0


@dataclass(frozen=True)
class PartRecord:
    """``part.json``: what a part read (its pieces of the corpus files, their scan and junk), with which settings
    and tokenizer, and what it wrote."""

    part: list[int]
    split_rule: str
    tokenizer_hash: str
    settings: dict[str, Any]
    corpus_bytes: int
    pieces: list[PieceInfo]
    junk: list[Junk]  # the first MAX_JUNK_ITEMS of each file and kind
    splits: dict[str, PartSplit]
    junk_counts: dict[str, dict[str, int]] | None = (
        None  # file -> kind -> items (None: before counts, all listed)
    )

    def check(self, fail: Callable[[str, str], typing.NoReturn]) -> None:
        if len(self.part) != 2 or not 1 <= self.part[0] <= self.part[1]:
            fail("part", "must be [I, N] with 1 <= I <= N")
        if set(self.splits) != set(SPLITS):
            fail("splits", f"must hold {' and '.join(SPLITS)}")
        for k, piece in enumerate(self.pieces):
            if piece.spans is not None and (
                len(piece.spans) != 3 or not 0 <= piece.spans[0] < piece.spans[1] <= piece.spans[2]
            ):
                fail(f"pieces[{k}].spans", "must be [first, end, count] with first < end <= count")
            if (
                piece.spans is not None
                and piece.encoding is not None
                and (len(piece.span_sha256) != piece.spans[1] - piece.spans[0])
            ):
                fail(f"pieces[{k}].span_sha256", "must give one sha256 per span read")
        for split, info in self.splits.items():
            if "/" in info.file or info.file in ("", ".", ".."):
                fail(f"splits.{split}.file", "must be a file name")
            if split == "val":
                if info.starts is None or len(info.starts) != info.documents:
                    fail("splits.val.starts", "must give one token offset per document")
                if any(a >= b for a, b in itertools.pairwise(info.starts)) or (
                    info.starts and (info.starts[0] != 0 or info.starts[-1] >= info.tokens)
                ):
                    fail("splits.val.starts", "must start at 0 and increase within the tokens")
                if len(info.items) != info.documents:
                    fail("splits.val.items", "must give one record per document")
            elif info.starts is not None:
                fail(f"splits.{split}.starts", "must be absent (only val keeps document starts)")


PART_ADVICE = "the part is damaged or from another version: prepare it again"


def read_part_record(path: str | Path) -> PartRecord:
    return read_record(PartRecord, path, PART_ADVICE)


@dataclass(frozen=True)
class JournalShard:
    file: str
    tokens: int
    sha256: str
    cursor: list[Signed]  # [document, its tokens already in shards, documents of the split started]


@dataclass(frozen=True)
class JournalSplit:
    shards: list[JournalShard]
    cursor: list[Signed]
    done: bool
    starts: list[int] | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0


@dataclass(frozen=True)
class Journal:
    """``.prepare-state.json``: the shards an interrupted preparation wrote, and where each split resumes. Its
    numbers must agree with each other: a resume from a wrong cursor would silently drop or repeat text."""

    fingerprint: str
    tokenizer_hash: str
    splits: dict[str, JournalSplit]

    def check(self, fail: Callable[[str, str], typing.NoReturn]) -> None:
        if set(self.splits) != set(SPLITS):
            fail("splits", f"must hold {' and '.join(SPLITS)}")
        for name, split in self.splits.items():
            cursors = [shard.cursor for shard in split.shards]
            for i, cursor in enumerate([split.cursor, *cursors]):
                if len(cursor) != 3:
                    where = f"splits.{name}.cursor" if i == 0 else f"splits.{name}.shards[{i - 1}].cursor"
                    fail(where, "must be three integers")
            for i, shard in enumerate(split.shards):
                if shard.file != f"{name}_{i:06d}.bin":
                    fail(f"splits.{name}.shards[{i}].file", f"must be {name}_{i:06d}.bin")
            if any(a > b for a, b in itertools.pairwise(cursors)):
                fail(f"splits.{name}.shards", "must have non-decreasing cursors")
            if split.shards and split.cursor != cursors[-1]:
                fail(f"splits.{name}.cursor", "must be the cursor of its last shard")
            if not split.shards and not split.done and split.cursor != [-1, 0, 0]:
                fail(f"splits.{name}.cursor", "must be [-1, 0, 0] before the first shard")
            starts = split.starts
            if starts:
                if starts[0] != 0 or any(a >= b for a, b in itertools.pairwise(starts)):
                    fail(f"splits.{name}.starts", "must start at 0 and increase")
                written = sum(shard.tokens for shard in split.shards)
                if sum(t < written for t in starts) != (cursors[-1][2] if split.shards else 0):
                    fail(f"splits.{name}.starts", "must count the documents its shards hold")


JOURNAL_ADVICE = (
    "the journal of the interrupted preparation is damaged: delete it (the shards are then prepared again) or use "
    "--overwrite"
)


@dataclass(frozen=True)
class ShardEntry:
    file: str
    tokens: int
    sha256: str = ""  # absent in adopted manifests before they recorded it


@dataclass(frozen=True)
class ManifestSplit:
    shards: list[ShardEntry]
    tokens: int = -1  # absent: not checked against the shards


@dataclass(frozen=True)
class Manifest:
    """The fields of ``manifest.json`` every reader relies on, with their types; the rest is read where used.
    A field that is absent takes its default; one that is present must be of its type (null included)."""

    splits: dict[str, ManifestSplit]
    vocab_size: int = -1
    eot_id: int = -1
    tokenizer_hash: str = ""

    def check(self, fail: Callable[[str, str], typing.NoReturn]) -> None:
        if not self.splits:
            fail("splits", "must map split names to their shards")
        for name, split in self.splits.items():
            for i, shard in enumerate(split.shards):
                where = f"splits.{name}.shards[{i}]"
                file = shard.file
                if not file or "/" in file or "\\" in file or file.startswith("."):
                    fail(f"{where}.file", "must be a shard file name in the dataset directory")
                if shard.tokens >= 2**40:
                    fail(f"{where}.tokens", "must be a token count")
                if shard.sha256 and len(shard.sha256) != 64:
                    fail(f"{where}.sha256", "must be a 64-digit hex string")
            if split.tokens != -1 and split.tokens != sum(shard.tokens for shard in split.shards):
                fail(
                    f"splits.{name}.tokens",
                    "must be the sum of its shards' tokens (a shard entry is missing or changed)",
                )


MANIFEST_ADVICE = "re-run `tablefree data prepare` (or `data adopt`)"


@dataclass(frozen=True)
class DocumentSplit:
    shards: list[ShardEntry]
    document_starts: list[int] | None = None  # absent: found as the EOT positions (adopted datasets, train)


@dataclass(frozen=True)
class ValidationItem:
    """A validation document's record: its token range in the val stream. Where its text came from (``file``,
    ``document_in_file``, ``whole``, ``chars``, ``planned_chars``) is read where used."""

    start: int
    tokens: int


@dataclass(frozen=True)
class ValidationRecord:
    items: list[ValidationItem]


@dataclass(frozen=True)
class ManifestDocuments:
    """Where a manifest's documents lie in their split's token stream: ``splits.<split>.document_starts`` and one
    ``validation.items`` record per val document, with that document's start and tokens. Read apart from
    :class:`Manifest`, by the readers of documents only: a plan dataset's validation split can hold hundreds of
    thousands of documents, which every other read of the manifest would pay for."""

    splits: dict[str, DocumentSplit]
    validation: ValidationRecord | None = None

    def check(self, fail: Callable[[str, str], typing.NoReturn]) -> None:
        for name, split in self.splits.items():
            starts = split.document_starts
            bounds = [*(starts or []), sum(shard.tokens for shard in split.shards)]
            if starts and (starts[0] != 0 or any(a >= b for a, b in itertools.pairwise(bounds))):
                fail(
                    f"splits.{name}.document_starts",
                    "must begin at 0 and increase, each start within the split's tokens",
                )
        if self.validation is None:
            return
        val = self.splits.get("val")
        if val is None or val.document_starts is None:
            fail(
                "splits.val.document_starts", "is missing: validation.items gives each document's start in it"
            )
        starts = val.document_starts
        bounds = [*starts, sum(shard.tokens for shard in val.shards)]
        items = self.validation.items
        if len(items) != len(starts):
            fail(
                "validation.items",
                f"must list the {len(starts)} documents of splits.val.document_starts, not {len(items)}",
            )
        for j, (item, (a, b)) in enumerate(zip(items, itertools.pairwise(bounds), strict=True)):
            if (item.start, item.tokens) != (a, b - a):
                fail(
                    f"validation.items[{j}]",
                    f"must have start {a} and tokens {b - a} (splits.val.document_starts)",
                )


def read_manifest_documents(manifest: dict, path: str | Path) -> ManifestDocuments:
    """The document starts and validation records of ``manifest`` (read from ``path``), checked."""
    return parse_record(ManifestDocuments, manifest, path, MANIFEST_ADVICE)


MANIFEST = "manifest.json"


def read_manifest(data_dir: str | Path) -> dict:
    """The dataset manifest; its presence marks a completely prepared dataset. A missing, malformed or
    incomplete manifest is a ValueError (FileNotFoundError when missing) naming the file, line or field."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {_not_prepared_hint(data_dir)}")
    manifest = read_json(path)
    parse_record(Manifest, manifest, path, MANIFEST_ADVICE)  # the fields every reader relies on
    return manifest


def _not_prepared_hint(data_dir: Path) -> str:
    """Why ``data_dir`` is no dataset, and the command that makes one (never into the corpus itself)."""
    if data_dir.is_dir() and _holds_corpus_files(data_dir):
        out = Path("data") / data_dir.name  # beside the run's other data, never inside someone's corpus
        if out.resolve() == data_dir.resolve():
            out = Path("data") / f"{data_dir.name}-prepared"
        return (
            f"{data_dir} holds raw corpus files, not a prepared dataset; prepare it into a directory of its "
            f"own (`tablefree data prepare {data_dir} --out {out}`) and point data.dir at {out}"
        )
    return (
        f"{data_dir} is not a prepared dataset (run `tablefree data prepare CORPUS --out {data_dir}`, "
        "where CORPUS is your text files)"
    )


def _holds_corpus_files(directory: Path, limit: int = 1000) -> bool:
    suffixes = {".txt", ".jsonl", ".ndjson", ".parquet", ".gz", ".zst", ".zstd"}
    for i, path in enumerate(directory.rglob("*")):
        if i >= limit:
            return False
        if path.is_file() and path.suffix.lower() in suffixes:
            return True
    return False
