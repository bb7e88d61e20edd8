"""Preparing a dataset across jobs: ``--part I/N`` tokenizes the I-th of N contiguous groups of the corpus
files into ``DIR/parts/I-of-N/``; ``data merge`` checks every part first, then feeds their token streams, in
order, to the dataset's shard writers, as a single run feeds them (byte-identical to it).

A part directory holds one raw token file per split (no header) and ``part.json``, written last. A part is
prepared whole, never resumed, under a lock (an ``flock`` on ``.lock`` in its directory: the kernel releases it
when the process exits, however it exits), so two processes never write one part.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tablefree.data.corpus import CorpusSummary
from tablefree.data.documents import SPLITS, LocalDocuments
from tablefree.data.shards import dtype_for_vocab
from tablefree.data.tokenizing import TokenSink, tokenize_documents
from tablefree.fileio import read_json, sha256_file, try_pid_lock, write_json_atomic

PARTS_DIR = "parts"  # in the dataset directory: one directory per part, I-of-N
PART_FILE = "part.json"  # written last: its presence marks a finished part
LOCK_FILE = ".lock"  # held while the part is prepared
MERGE_CHUNK_TOKENS = 1 << 24


def part_dir(out_dir: Path, index: int, n: int) -> Path:
    return out_dir / PARTS_DIR / f"{index}-of-{n}"


def part_file_ranges(summary: CorpusSummary, n: int) -> list[tuple[int, int]]:
    """[first, end) file indices of each of ``n`` parts: contiguous groups of files of about equal bytes."""
    files = summary.files
    if n > len(files):
        raise ValueError(
            f"part: {n} parts, but the corpus has only {len(files)} files (a part is a set of files)"
        )
    ends = np.cumsum([info.bytes for info in files])
    cuts = [0]
    for k in range(1, n):  # part k starts at the first file past k/n of the bytes, keeping a file per part
        share = int(np.searchsorted(ends, k * int(ends[-1]) / n)) + 1
        cuts.append(min(max(share, cuts[-1] + 1), len(files) - (n - k)))
    cuts.append(len(files))
    return list(itertools.pairwise(cuts))


class _DocumentRange:
    """The stream of ``docs`` ending before document ``end`` (a part reads only its own files)."""

    def __init__(self, docs: LocalDocuments, end: int) -> None:
        self.docs, self.end = docs, end

    def documents(self, start: int) -> Iterator[str]:
        return itertools.islice(self.docs.documents(start), max(0, self.end - start))

    def split_of(self, index: int) -> str:
        return self.docs.split_of(index)


class PartWriter:
    """One split's token stream of a part, as one raw file (no header): what its documents hold, in order."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, first: int, end: int) -> None:
        self.path = directory / f"{split}.tokens"
        self.temp = directory / f".{split}.tokens.tmp"
        self.handle = open(self.temp, "wb")  # noqa: SIM115 (closed by finish)
        self.dtype, self.resume_doc, self.end, self.done = dtype, first, end, False
        self.documents = self.tokens = 0
        self.starts: list[int] | None = [] if split == "val" else None
        self.digest = hashlib.sha256()

    def wants(self, doc: int) -> bool:
        return self.resume_doc <= doc < self.end

    def add(self, doc: int, tokens: np.ndarray, first: bool, on_shard) -> None:
        if first:
            self.documents += 1
            if self.starts is not None:
                self.starts.append(self.tokens)
        data = tokens.astype(self.dtype, copy=False).tobytes()
        self.handle.write(data)
        self.digest.update(data)
        self.tokens += len(tokens)

    def finish(self) -> dict:
        self.handle.close()
        os.replace(self.temp, self.path)
        self.done = True
        record = {"file": self.path.name, "tokens": self.tokens, "documents": self.documents}
        return {**record, "sha256": self.digest.hexdigest(), "starts": self.starts}


@contextlib.contextmanager
def _part_lock(directory: Path, index: int, n: int) -> Iterator[None]:
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


def prepare_part(
    out_dir: Path,
    docs: LocalDocuments,
    summary: CorpusSummary,
    tok: Tokenizer,
    vocab: int,
    inputs: dict,
    fingerprint: str,
    part: tuple[int, int],
    workers: int,
    progress: bool,
) -> dict:
    """Tokenize part ``part`` = (I, N) of the corpus into ``out_dir/parts/I-of-N/`` and return its record.
    ``inputs`` (tokenizer hash, sources, settings) is kept in the record so a merge can name what differs."""
    index, n = part
    first_file, end_file = part_file_ranges(summary, n)[index - 1]
    file_docs = docs.corpus.file_document_ranges()
    first_doc = file_docs[first_file][0]
    end_doc = file_docs[end_file - 1][1] if end_file > first_file else first_doc
    first, end = int(docs.first_unit[first_doc]), int(docs.first_unit[end_doc])
    directory = part_dir(out_dir, index, n)
    directory.mkdir(parents=True, exist_ok=True)
    with _part_lock(directory, index, n):
        (directory / PART_FILE).unlink(missing_ok=True)  # a part is prepared whole, never resumed
        dtype = dtype_for_vocab(vocab)
        writers = {split: PartWriter(directory, split, dtype, first, end) for split in SPLITS}
        tokenize_documents(_DocumentRange(docs, end), tok, writers, workers, lambda: None, progress)
        record = {
            "part": [index, n],
            "fingerprint": fingerprint,
            "tokenizer_hash": inputs["tokenizer_hash"],
            "inputs": {"sources": inputs["sources"], "settings": inputs["settings"]},
            "files": [summary.files[i].file for i in range(first_file, end_file)],
            "stream": [first, end],
            "splits": {split: writer.finish() for split, writer in writers.items()},
        }
        write_json_atomic(directory / PART_FILE, record)
    return record


def checked_parts(out_dir: Path, inputs: dict, fingerprint: str, dtype: np.dtype) -> list[dict]:
    """The finished parts in ``out_dir``, in order, after checking all of them (nothing is written before): all
    N are there, each of this corpus, settings and tokenizer (a difference is named with both values), their
    streams contiguous and every token file as its ``part.json`` records it (size and sha256)."""
    paths = sorted((out_dir / PARTS_DIR).glob(f"*/{PART_FILE}"))
    if not paths:
        raise FileNotFoundError(
            f"{out_dir / PARTS_DIR}: no finished part; run `data prepare --part I/N` first"
        )
    records = [_checked_record(read_json(path), path) for path in paths]
    n = records[0]["part"][1]
    records.sort(key=lambda record: record["part"][0])
    found = [record["part"] for record in records]
    if found != [[i, n] for i in range(1, n + 1)]:
        missing = sorted({i for i in range(1, n + 1)} - {i for i, m in found if m == n})
        raise ValueError(f"{out_dir / PARTS_DIR}: parts of {n} expected, missing {missing} (found {found})")
    end = 0
    for record in records:
        index = record["part"][0]
        where = part_dir(out_dir, index, n) / PART_FILE
        if record["fingerprint"] != fingerprint:
            raise ValueError(f"{where}: part {index}/{n} {_difference(record, inputs)}")
        if record["stream"][0] != end:
            raise ValueError(
                f"{where}: part {index}/{n} field stream: its documents start at {record['stream'][0]}, "
                f"the previous part ends at {end}; prepare the part again"
            )
        end = record["stream"][1]
    for record in records:
        index = record["part"][0]
        for split in SPLITS:
            info = record["splits"][split]
            path = part_dir(out_dir, index, n) / info["file"]
            if not path.is_file():
                raise ValueError(
                    f"{path}: part {index}/{n}'s {split} tokens are missing; prepare the part again"
                )
            size, expected = path.stat().st_size, info["tokens"] * dtype.itemsize
            if size != expected:
                raise ValueError(
                    f"{path}: part {index}/{n} field splits.{split}.tokens: the file holds {size} bytes, "
                    f"{PART_FILE} records {info['tokens']} tokens ({expected} bytes); prepare the part again"
                )
            digest = sha256_file(path)
            if digest != info["sha256"]:
                raise ValueError(
                    f"{path}: part {index}/{n} field splits.{split}.sha256: the file's is {digest[:16]}…, "
                    f"{PART_FILE} records {info['sha256'][:16]}… (damaged or changed); prepare the part again"
                )
    return records


def _checked_record(record: object, path: Path) -> dict:
    """A ``part.json`` of the shape :func:`prepare_part` writes, or a one-line error naming the field."""

    def fail(name: str, expected: str) -> None:
        raise ValueError(f"{path}: field {name!r} {expected}; the part is damaged: prepare it again")

    def ints(value: object, count: int) -> bool:
        return (
            isinstance(value, list)
            and len(value) == count
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )

    if not isinstance(record, dict):
        fail("(top level)", "must be a JSON object")
    if not ints(record.get("part"), 2) or not 1 <= record["part"][0] <= record["part"][1]:
        fail("part", "must be [I, N] with 1 <= I <= N")
    if not ints(record.get("stream"), 2):
        fail("stream", "must be two document indices")
    for key in ("fingerprint", "tokenizer_hash"):
        if not isinstance(record.get(key), str):
            fail(key, "must be a string")
    splits = record.get("splits")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        fail("splits", f"must hold {' and '.join(SPLITS)}")
    for split, info in splits.items():
        if not isinstance(info, dict) or not isinstance(info.get("file"), str) or "/" in info["file"]:
            fail(f"splits.{split}.file", "must be a file name")
        if not ints([info.get("tokens"), info.get("documents")], 2) or not isinstance(
            info.get("sha256"), str
        ):
            fail(f"splits.{split}", "must hold a token count, a document count and a sha256")
        starts = info.get("starts")
        if split == "val" and not (isinstance(starts, list) and ints(starts, len(starts))):
            fail(f"splits.{split}.starts", "must be a list of token offsets")
    return record


def _difference(record: dict, inputs: dict) -> str:
    """What makes a part's inputs differ from this merge's: the first field that differs, with both values."""
    advice = "; prepare the part again with this merge's arguments, or merge with the part's"
    if record["tokenizer_hash"] != inputs["tokenizer_hash"]:
        return (
            f"field tokenizer_hash: the part's {record['tokenizer_hash'][:16]}…, this merge's "
            f"{inputs['tokenizer_hash'][:16]}…{advice}"
        )
    theirs = record.get("inputs")
    if not isinstance(theirs, dict):  # a part.json from before parts recorded their inputs
        return f"was prepared from other inputs, settings or tokenizer than this merge{advice}"
    sources, ours = theirs.get("sources") or [], inputs["sources"]
    for i, (a, b) in enumerate(itertools.zip_longest(sources, ours, fillvalue={})):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                name = b.get("file") or a.get("file")
                values = f"the part's {a.get(key)!r}, this merge's {b.get(key)!r}"
                return f"field sources[{i}].{key} ({name}): {values}{advice}"
    settings, ours = theirs.get("settings") or {}, inputs["settings"]
    for key in sorted(set(settings) | set(ours), key=str):
        if settings.get(key) != ours.get(key):
            values = f"the part's {settings.get(key)!r}, this merge's {ours.get(key)!r}"
            return f"field settings.{key}: {values}{advice}"
    return f"was prepared from other inputs, settings or tokenizer than this merge{advice}"


def merge_parts(out_dir: Path, records: list[dict], writers: dict[str, TokenSink], journal) -> None:
    """Feed every part's streams (checked by :func:`checked_parts`), in order, to the dataset's shard writers,
    as a single run feeds them."""
    n = len(records)
    for split, writer in writers.items():
        for record in records:
            info = record["splits"][split]
            path = part_dir(out_dir, record["part"][0], n) / info["file"]
            tokens = (
                np.memmap(path, dtype=writer.dtype, mode="r") if info["tokens"] else np.empty(0, writer.dtype)
            )
            first = record["stream"][0]
            if info["starts"] is None:  # train: one stream; only the document count is kept
                for offset in range(0, len(tokens), MERGE_CHUNK_TOKENS):
                    writer.add(first, tokens[offset : offset + MERGE_CHUNK_TOKENS], False, journal)
                writer.documents += info["documents"]
            else:  # val: document by document, for the stream offsets of their starts
                bounds = [*info["starts"], len(tokens)]
                for k, (a, b) in enumerate(itertools.pairwise(bounds)):
                    writer.add(first + k, tokens[a:b], True, journal)
