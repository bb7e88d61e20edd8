"""Preparing a dataset across jobs: ``--part I/N`` reads only the I-th of N contiguous runs of the corpus files'
spans (:mod:`tablefree.data.spans`: whole files, parquet row groups, byte ranges of a ``.jsonl``; of about equal
weight) and tokenizes them into ``DIR/parts/I-of-N/``; ``data merge`` checks every part first,
then feeds their token streams, in order, to the dataset's shard writers, as a single run feeds them
(byte-identical to it). Parts use the keyed-hash split rule (:class:`tablefree.data.documents.KeyedHashDocuments`),
which a part applies to its own documents alone, so the merge reads no corpus text: only the corpus listing
(names, sizes and parquet footers), the parts' records and their token files.

A part directory holds one raw token file per split (no header) and ``part.json``, written last. A part is
prepared whole, never resumed, under a lock (an ``flock`` on ``.lock`` in its directory: the kernel releases it
when the process exits, however it exits), so two processes never write one part.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tablefree.data.corpus import CorpusSummary, PieceInfo, compose_files
from tablefree.data.documents import SPLITS
from tablefree.data.records import PartRecord, read_part_record
from tablefree.data.sources import JunkLog, SourceFile
from tablefree.data.spans import Piece
from tablefree.data.tokenizing import TokenSink
from tablefree.data.writer import over_cap
from tablefree.fileio import sha256_file, try_pid_lock

PARTS_DIR = "parts"  # in the dataset directory: one directory per part, I-of-N
PART_FILE = "part.json"  # written last: its presence marks a finished part
LOCK_FILE = ".lock"  # held while the part is prepared
MERGE_CHUNK_TOKENS = 1 << 24
PieceKey = tuple[str, int, list[int] | None]  # what a part's piece is checked by: name, bytes, spans


def part_dir(out_dir: Path, index: int, n: int) -> Path:
    return out_dir / PARTS_DIR / f"{index}-of-{n}"


def file_sizes(sources: Sequence[SourceFile]) -> list[int]:
    """Each listed file's size on disk (0 when it cannot be read): what a part knows of the others."""
    sizes = []
    for source in sources:
        try:
            sizes.append(source.path.stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes


class PartWriter:
    """One split's token stream of a part, as one raw file (no header): what its documents hold, in order. The
    val stream also keeps each document's start and record, and leaves out documents that start after it holds
    ``max_tokens`` (the whole dataset's val stream holds at least as many tokens before them)."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, max_tokens: int | None) -> None:
        self.path = directory / f"{split}.tokens"
        self.temp = directory / f".{split}.tokens.tmp"
        self.handle = open(self.temp, "wb")  # noqa: SIM115 (closed by finish)
        self.dtype, self.resume_doc, self.done, self.max_tokens = dtype, 0, False, max_tokens
        self.documents = self.tokens = self.dropped = 0
        self.dropping = -1
        self.starts: list[int] | None = [] if split == "val" else None
        self.items: list[dict] = []
        self.digest = hashlib.sha256()

    def wants(self, doc: int) -> bool:
        return True

    def add(self, doc: int, tokens: np.ndarray, first: bool, on_shard, where: dict | None = None) -> None:
        if first and over_cap(self.tokens, self.max_tokens):
            self.dropping = doc
            self.dropped += 1
        if doc == self.dropping:
            return
        if first:
            self.documents += 1
            if self.starts is not None:
                self.starts.append(self.tokens)
            if where is not None:
                self.items.append(where)
        data = tokens.astype(self.dtype, copy=False).tobytes()
        self.handle.write(data)
        self.digest.update(data)
        self.tokens += len(tokens)

    def finish(self) -> dict:
        self.handle.close()
        os.replace(self.temp, self.path)
        self.done = True
        record = {"file": self.path.name, "tokens": self.tokens, "documents": self.documents}
        if self.starts is None:
            return {**record, "sha256": self.digest.hexdigest()}
        extra = {"starts": self.starts, "items": self.items, "dropped": self.dropped}
        return {**record, "sha256": self.digest.hexdigest(), **extra}


@contextlib.contextmanager
def part_lock(directory: Path, index: int, n: int) -> Iterator[None]:
    """Hold the part's lock, or refuse in one line when another process holds it."""
    path = directory / LOCK_FILE
    handle, holder = try_pid_lock(path)
    if handle is None:
        raise ValueError(
            f"{directory}: part {index}/{n} is being prepared by another process now (pid {holder}; lock "
            f"{path}); wait for it to finish, or stop it and run `data prepare --part {index}/{n}` again"
        )
    with handle:
        yield  # closing the file releases the lock


def checked_parts(
    out_dir: Path,
    expected: list[list[PieceKey]],
    corpus_bytes: int,
    settings: dict,
    tokenizer_hash: str,
    dtype: np.dtype,
) -> tuple[list[PartRecord], CorpusSummary]:
    """The finished parts in ``out_dir``, in order, after checking all of them (nothing is written before): all
    N are there, each of this tokenizer and these settings (a difference is named with both values), each over
    the pieces ``expected`` gives it (the corpus cut into N by :func:`tablefree.data.spans.plan_pieces`: names,
    sizes and spans), cut from a corpus of ``corpus_bytes``, every token file as its ``part.json`` records it
    (size and sha256). Returns them with the corpus summary their scans make together."""
    paths = sorted((out_dir / PARTS_DIR).glob(f"*/{PART_FILE}"))
    if not paths:
        raise FileNotFoundError(
            f"{out_dir / PARTS_DIR}: no finished part; run `data prepare --part I/N` first"
        )
    records = [read_part_record(path) for path in paths]
    n = records[0].part[1]
    records.sort(key=lambda record: record.part[0])
    found = [list(record.part) for record in records]
    if found != [[i, n] for i in range(1, n + 1)]:
        missing = sorted({i for i in range(1, n + 1)} - {i for i, m in found if m == n})
        raise ValueError(f"{out_dir / PARTS_DIR}: parts of {n} expected, missing {missing} (found {found})")
    advice = "; prepare the part again with this merge's arguments, or merge with the part's"
    for record, listed in zip(records, expected, strict=True):
        index = record.part[0]
        where = part_dir(out_dir, index, n) / PART_FILE
        if record.tokenizer_hash != tokenizer_hash:
            raise ValueError(
                f"{where}: part {index}/{n} field tokenizer_hash: the part's {record.tokenizer_hash[:16]}…, "
                f"this merge's {tokenizer_hash[:16]}…{advice}"
            )
        for key in sorted(set(record.settings) | set(settings), key=str):
            if record.settings.get(key) != settings.get(key):
                values = f"the part's {record.settings.get(key)!r}, this merge's {settings.get(key)!r}"
                raise ValueError(f"{where}: part {index}/{n} field settings.{key}: {values}{advice}")
        theirs = [piece_key(info.file, info.bytes, info) for info in record.pieces]
        for k, (a, b) in enumerate(itertools.zip_longest(theirs, listed)):
            if a != b:
                raise ValueError(
                    f"{where}: part {index}/{n} field pieces[{k}]: the part read {_file(a)}, this merge's "
                    f"corpus gives it {_file(b)} (another corpus, or files changed since){advice}"
                )
    for record in records:  # each part's own files agree; the others' sizes fixed how the corpus was cut
        if record.corpus_bytes != corpus_bytes:
            index = record.part[0]
            raise ValueError(
                f"{part_dir(out_dir, index, n) / PART_FILE}: part {index}/{n} field corpus_bytes: the part's "
                f"{record.corpus_bytes:,}, this merge's {corpus_bytes:,} (another corpus, or files changed since)"
                f"{advice}"
            )
    for record in records:
        index = record.part[0]
        for split in SPLITS:
            info = record.splits[split]
            path = part_dir(out_dir, index, n) / info.file
            if not path.is_file():
                raise ValueError(
                    f"{path}: part {index}/{n}'s {split} tokens are missing; prepare the part again"
                )
            size, expected = path.stat().st_size, info.tokens * dtype.itemsize
            if size != expected:
                raise ValueError(
                    f"{path}: part {index}/{n} field splits.{split}.tokens: the file holds {size} bytes, "
                    f"{PART_FILE} records {info.tokens} tokens ({expected} bytes); prepare the part again"
                )
            digest = sha256_file(path)
            if digest != info.sha256:
                raise ValueError(
                    f"{path}: part {index}/{n} field splits.{split}.sha256: the file's is {digest[:16]}…, "
                    f"{PART_FILE} records {info.sha256[:16]}… (damaged or changed); prepare the part again"
                )
    pieces = [piece for record in records for piece in record.pieces]
    junk = JunkLog()
    for record in records:
        junk.join(record.junk, record.junk_counts)
    summary = CorpusSummary(files=compose_files(pieces), junk_log=junk, pieces=pieces)
    return records, summary


def piece_key(file: str, size: int, piece: Piece | PieceInfo) -> PieceKey:
    """(name, bytes, spans) of a piece: the spans [first, end, count] read, None for a file read whole."""
    if isinstance(piece, PieceInfo):
        return file, size, piece.spans
    return file, size, None if piece.whole else [piece.first, piece.end, piece.count]


def _file(piece: PieceKey | None) -> str:
    if piece is None:
        return "no file"
    file, size, spans = piece
    share = "" if spans is None else f" (spans {spans[0]}-{spans[1]} of {spans[2]})"
    return f"{file} of {size:,} bytes{share}"


def feed_parts(out_dir: Path, records: list[PartRecord], writers: dict[str, TokenSink], journal) -> None:
    """Feed every part's streams (checked by :func:`checked_parts`), in order, to the dataset's shard writers,
    as a single run feeds them: train as one stream, val document by document (the writer applies the cap)."""
    n = len(records)
    for split, writer in writers.items():
        doc = 0
        for record in records:
            info = record.splits[split]
            path = part_dir(out_dir, record.part[0], n) / info.file
            tokens = (
                np.memmap(path, dtype=writer.dtype, mode="r") if info.tokens else np.empty(0, writer.dtype)
            )
            if info.starts is None:  # train: one stream; only the document count is kept
                for offset in range(0, len(tokens), MERGE_CHUNK_TOKENS):
                    writer.add(doc, tokens[offset : offset + MERGE_CHUNK_TOKENS], False, journal)
                writer.documents += info.documents
                doc += 1
            else:  # val: document by document, for the stream offsets of their starts and their records
                bounds = [*info.starts, len(tokens)]
                for (a, b), item in zip(itertools.pairwise(bounds), info.items, strict=True):
                    writer.add(doc, tokens[a:b], True, journal, item)
                    doc += 1
                writer.dropped += info.dropped
