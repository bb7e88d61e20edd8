"""``prepare_dataset``: corpus → tokenizer → train/val token shards + ``manifest.json``.

Layout of a prepared dataset directory::

    tokenizer.json          # copy of the tokenizer (its sha256 of to_str() is the manifest's tokenizer_hash)
    train_000000.bin ...    # llm.c / modded-nanogpt shards (see tablefree.data.shards)
    val_000000.bin ...
    manifest.json           # written LAST: its presence marks a complete dataset

Each document becomes ``[EOT] + tokens(document)`` (llm.c's convention: the end-of-text token *precedes*
every document, so it separates documents). Documents go to ``val`` or ``train`` whole: for a local corpus
exactly ``max(1, round(val_fraction · N))`` of the N documents are drawn for ``val`` with
``numpy.random.default_rng(seed)``; for a streamed hub dataset (N unknown) each document's index is hashed with
the seed and compared with ``val_fraction``. Each split's token stream is cut into shards of exactly
``shard_tokens`` tokens (the last one shorter), so shard boundaries depend only on the inputs and settings.

Interruption and resume: every shard is written atomically, and after each one a small journal
(``.prepare-state.json``) records it with its sha256 and the resume cursor of its split (the document and the
number of that document's tokens already written). A re-run with the same inputs and settings verifies the
journalled shards, keeps the valid ones, re-reads the corpus from the earliest cursor, tokenizes only what is
missing and writes the remaining shards — byte-identical to an uninterrupted run. A directory prepared with other
inputs, settings or another tokenizer is an error (``overwrite=True`` starts afresh).
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from tablefree.data.corpus import Corpus, CorpusSummary, Junk
from tablefree.data.loader import MANIFEST, read_manifest
from tablefree.data.shards import read_header, version_for_vocab, write_shard
from tablefree.data.tokenizer import (
    check_tokenizer,
    eot_id,
    is_split_safe,
    load_tokenizer,
    save_tokenizer,
    split_points,
    tokenizer_hash,
    train_tokenizer_from_texts,
)
from tablefree.fileio import read_json, sha256_file, write_json_atomic

MANIFEST_VERSION = 1
STATE_FILE = ".prepare-state.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 100_000_000  # as llm.c's and modded-nanogpt's FineWeb shards
DEFAULT_VOCAB_SIZE = 32_768
TASK_CHARS = 1 << 20  # text per worker task
PIECE_CHARS = (
    1 << 16
)  # long documents are encoded in pieces of about this size (when exact; see tokenizer.py)


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face ``datasets`` dataset, streamed (``pip install 'tablefree[hub]'``). For a local test,
    ``name="parquet"`` or ``"json"`` with ``data_files``."""

    name: str
    config: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    revision: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


# -- the document stream -------------------------------------------------------------------------------------


# The validation split may take at most this share of the corpus text (or val_fraction, if larger).
VAL_MAX_SHARE = 0.10
DEFAULT_VAL_DOCUMENTS = 20  # enough documents for a document-level (cluster) bootstrap
DEFAULT_VAL_SECTION_CHARS = 80_000  # about 20k tokens of English text with a byte-level BPE
MIN_VAL_SECTION_CHARS = 2_000


@dataclass
class ValidationPlan:
    """Which text of a local corpus is held out for validation.

    A document shorter than two sections goes to ``val`` whole (``whole``); a longer one gives ``sections``:
    contiguous character ranges held out as validation documents of their own, the text around them staying in
    ``train`` as separate documents. Every range is planned before any text is read again; when the text is
    read, each end moves forward to the next line start (at most ``snap`` characters on), so a section starts
    and ends at a line boundary, and the pieces around it are never empty."""

    whole: set[int] = field(default_factory=set)
    sections: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    section_chars: int = 0
    snap: int = 0

    @property
    def units(self) -> int:
        return len(self.whole) + sum(len(r) for r in self.sections.values())

    @property
    def sources(self) -> int:
        return len(self.whole) + len(self.sections)

    def pieces(self, doc: int) -> int:
        """How many documents of the stream source document ``doc`` becomes."""
        return 1 + 2 * len(self.sections.get(doc, ()))


def plan_validation(
    lengths: Sequence[int],
    val_fraction: float,
    min_documents: int = DEFAULT_VAL_DOCUMENTS,
    section_chars: int = DEFAULT_VAL_SECTION_CHARS,
    seed: int = 0,
) -> ValidationPlan:
    """Plan the validation split of documents of ``lengths`` characters (see :class:`ValidationPlan`).

    The split gets ``max(min_documents, round(val_fraction · N))`` validation documents when the corpus
    allows, within ``max(val_fraction, VAL_MAX_SHARE)`` of its text: documents are visited in a seeded random
    order, long documents first, one unit per source document (so the units come from different sources),
    then, only if more are needed, further sections of the long documents. A section is ``section_chars`` long, or shorter when
    that many sections would not fit (never under ``MIN_VAL_SECTION_CHARS``). At most half of a document is
    held out. With ``val_fraction`` 0 nothing is; with N ≥ 2 documents at least one unit is."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if val_fraction == 0 or n == 0 or int(lengths.sum()) == 0:
        return ValidationPlan()
    target = max(min_documents, round(val_fraction * n), 1)
    budget = max(val_fraction, VAL_MAX_SHARE) * float(lengths.sum())
    size = max(min(section_chars, int(budget // target)), MIN_VAL_SECTION_CHARS)
    capacity = lengths // (2 * size)  # sections a document can give, keeping at least half of it in train
    # Seeded order, long documents first: a section of a long book costs training a small part of it, a short
    # document held out whole costs all of it.
    order = sorted(np.random.default_rng(seed).permutation(n).tolist(), key=lambda d: capacity[d] == 0)
    whole: set[int] = set()
    counts: dict[int, int] = {}
    used, units, round_ = 0, 0, 0
    while units < target:
        added = False
        for doc in map(int, order):
            if units >= target:
                break
            if capacity[doc] == 0:
                fits = round_ == 0 and used + lengths[doc] <= budget and len(whole) < n - 1
                if fits:
                    whole.add(doc)
                    used, units, added = used + int(lengths[doc]), units + 1, True
            elif counts.get(doc, 0) == round_ < capacity[doc] and used + size <= budget:
                counts[doc] = round_ + 1
                used, units, added = used + size, units + 1, True
        if not added:
            break
        round_ += 1
    if units == 0 and n >= 2:  # a tiny corpus: hold out one document rather than none
        first = int(order[0])
        if capacity[first]:
            counts[first] = 1
        else:
            whole.add(first)
    snap = min(2_000, size // 10)
    margin = snap + 1
    placement = np.random.default_rng([seed, 1])
    sections = {}
    for doc in sorted(counts):
        k, length = counts[doc], int(lengths[doc])
        ranges = []
        for j in range(k):  # one section in each of k equal segments: they never overlap
            lo, hi = j * length // k, (j + 1) * length // k
            start = int(placement.integers(lo + margin, hi - size - margin + 1))
            ranges.append((start, start + size))
        sections[doc] = ranges
    return ValidationPlan(whole, sections, size, snap)


def _snap(text: str, position: int, limit: int) -> int:
    """``position`` moved forward to the next line start, if one is within ``limit`` characters."""
    newline = text.find("\n", position, position + limit)
    return position if newline == -1 else newline + 1


class LocalDocuments:
    """The documents of local files as the stream of the split: source documents, with validation
    sections cut out of long ones (:func:`plan_validation`). Index i of the stream is a "document" of
    the dataset; ``split_of(i)`` says where it goes."""

    def __init__(
        self,
        corpus: Corpus,
        summary: CorpusSummary,
        val_fraction: float,
        seed: int,
        val_documents: int = DEFAULT_VAL_DOCUMENTS,
        val_section_chars: int = DEFAULT_VAL_SECTION_CHARS,
    ) -> None:
        self.corpus, self.summary = corpus, summary
        self.lengths = list(corpus.document_chars)
        self.plan = plan_validation(self.lengths, val_fraction, val_documents, val_section_chars, seed)
        pieces = np.array([self.plan.pieces(d) for d in range(len(self.lengths))], dtype=np.int64)
        self.first_unit = np.concatenate(
            ([0], np.cumsum(pieces))
        )  # stream index of each source's first piece
        n_val = self.plan.units
        total = int(self.first_unit[-1])
        self.counts = {"train": total - n_val, "val": n_val}
        self.rule = (
            f"documents: {len(self.plan.whole)} whole, {n_val - len(self.plan.whole)} sections of "
            f"{self.plan.section_chars} characters from {len(self.plan.sections)} documents "
            f"(seeded plan, {len(self.lengths)} source documents)"
        )

    def source_of(self, index: int) -> tuple[int, int]:
        """(source document, piece number within it) of stream document ``index``."""
        doc = int(np.searchsorted(self.first_unit, index, side="right") - 1)
        return doc, index - int(self.first_unit[doc])

    def split_of(self, index: int) -> str:
        doc, piece = self.source_of(index)
        if doc in self.plan.whole or piece % 2 == 1:
            return "val"
        return "train"

    def documents(self, start: int) -> Iterator[str]:
        first_doc, _ = self.source_of(start) if start else (0, 0)
        index = int(self.first_unit[first_doc])
        for doc, text in enumerate(self.corpus.documents(first_doc), start=first_doc):
            for piece in self._pieces(doc, text):
                if index >= start:
                    yield piece
                index += 1

    def _pieces(self, doc: int, text: str) -> list[str]:
        ranges = self.plan.sections.get(doc)
        if not ranges:
            return [text]
        if len(text) != self.lengths[doc]:
            raise RuntimeError(
                f"document {doc} changed while it was being prepared ({len(text)} characters, "
                f"{self.lengths[doc]} when scanned)"
            )
        cuts = [0]
        for a, b in self.cut_ranges(doc, text):
            cuts += [a, b]
        cuts.append(len(text))
        return [text[a:b] for a, b in itertools.pairwise(cuts)]

    def cut_ranges(self, doc: int, text: str) -> list[tuple[int, int]]:
        """The held-out character ranges of source document ``doc``, moved to line starts."""
        snap = self.plan.snap
        return [(_snap(text, a, snap), _snap(text, b, snap)) for a, b in self.plan.sections.get(doc, ())]

    def validation_items(self) -> list[dict]:
        """Each validation document in stream order: its source file, source document and character range
        (planned; each end is moved forward to a line start when cut), or ``whole``."""
        ranges = self.corpus.file_document_ranges()
        files = [info.file for info in self.summary.files]
        items = []
        for doc in sorted(self.plan.whole | set(self.plan.sections)):
            file_index = next(i for i, (a, b) in enumerate(ranges) if a <= doc < b)
            where = {"file": files[file_index], "document_in_file": doc - ranges[file_index][0]}
            if doc in self.plan.whole:
                items.append({**where, "whole": True, "chars": self.lengths[doc]})
            else:
                items += [
                    {**where, "whole": False, "planned_chars": [a, b]} for a, b in self.plan.sections[doc]
                ]
        return items


class HubDocuments:
    """Documents streamed through ``datasets``; the split of document i hashes (seed, i)."""

    def __init__(
        self, source: HubSource, text_field: str, val_fraction: float, seed: int, max_documents: int | None
    ) -> None:
        self.source, self.text_field = source, text_field
        self.val_fraction, self.seed, self.max_documents = val_fraction, seed, max_documents
        self.counts = None
        self.junk: list[Junk] = []
        self.rule = "hash: blake2b(seed:index) / 2^64 < val_fraction"

    def split_of(self, index: int) -> str:
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=8).digest()
        return "val" if int.from_bytes(digest, "little") < self.val_fraction * 2**64 else "train"

    def documents(self, start: int) -> Iterator[str]:
        try:
            import datasets
        except ImportError as error:
            raise ValueError(
                "streaming a hub dataset needs the `hub` extra: pip install 'tablefree[hub]'"
            ) from error
        stream = datasets.load_dataset(
            self.source.name,
            self.source.config,
            split=self.source.split,
            data_files=self.source.data_files,
            revision=self.source.revision,
            streaming=True,
        )
        index = 0
        for row, record in enumerate(stream, start=1):
            if self.max_documents is not None and index >= self.max_documents:
                return
            text = record.get(self.text_field)
            if not isinstance(text, str) or not text.strip():
                self.junk.append(
                    Junk(self.source.name, row, "missing-field", f"no text in {self.text_field!r}")
                )
                continue
            if index >= start:
                yield text
            index += 1


# -- tokenization workers -------------------------------------------------------------------------------------

_worker_tokenizer: Tokenizer | None = None
_worker_eot = 0
_worker_dtype = np.dtype(np.uint16)


def _init_worker(tokenizer_json: str, eot: int, dtype: str) -> None:
    global _worker_tokenizer, _worker_eot, _worker_dtype
    _worker_tokenizer, _worker_eot, _worker_dtype = Tokenizer.from_str(tokenizer_json), eot, np.dtype(dtype)


def _encode_task(task: tuple[list[str], list[bool]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode a task's pieces (one thread): their concatenated tokens, each piece's token count (an EOT is
    prepended to every piece that starts a document), and the UTF-8 bytes encoded."""
    pieces, firsts = task
    arrays, lengths, nbytes = [], [], 0
    for text, first in zip(pieces, firsts, strict=True):
        ids = _worker_tokenizer.encode(text, add_special_tokens=False).ids
        if first:
            ids.insert(0, _worker_eot)
        arrays.append(np.asarray(ids, dtype=_worker_dtype))
        lengths.append(len(ids))
        nbytes += len(text.encode("utf-8"))
    tokens = np.concatenate(arrays) if arrays else np.empty(0, _worker_dtype)
    return tokens, np.asarray(lengths, dtype=np.int64), nbytes


class _InProcess:
    """The single-worker path: tasks are encoded in this process (no pool)."""

    def __init__(self, tokenizer_json: str, eot: int, dtype: str) -> None:
        _init_worker(tokenizer_json, eot, dtype)

    def apply_async(self, func, args):  # mirrors multiprocessing.pool.Pool
        result = func(*args)
        return _Done(result)

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    def join(self) -> None:
        pass


class _Done:
    def __init__(self, value) -> None:
        self.value = value

    def get(self):
        return self.value


def _make_pool(workers: int, tokenizer: Tokenizer, eot: int, dtype: np.dtype):
    args = (tokenizer.to_str(), eot, dtype.str)
    if workers <= 1:
        return _InProcess(*args)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    # Workers are single-threaded; telling tokenizers so before forking also silences its fork warning.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return multiprocessing.get_context(method).Pool(workers, initializer=_init_worker, initargs=args)
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


# -- shard writing and the journal -----------------------------------------------------------------------------


class SplitWriter:
    """Accumulates one split's token stream and writes it as fixed-size shards, journalling each."""

    def __init__(
        self, out_dir: Path, split: str, shard_tokens: int, vocab_size: int, saved: dict | None
    ) -> None:
        self.out_dir, self.split, self.shard_tokens, self.vocab_size = (
            out_dir,
            split,
            shard_tokens,
            vocab_size,
        )
        self.dtype = np.dtype(np.uint16 if version_for_vocab(vocab_size) == 1 else np.uint32)
        saved = saved or {"shards": [], "cursor": [-1, 0, 0], "done": False, "starts": []}
        self.shards: list[dict] = saved["shards"]
        self.done: bool = saved["done"]
        self.written = sum(s["tokens"] for s in self.shards)
        # Stream offset of each document's first token (its EOT), for val only: an evaluator's per-document
        # losses need them, and train's could be millions long.
        # The journal may hold starts of documents not yet in a shard: those are written again on resume.
        starts = [t for t in saved.get("starts") or [] if t < self.written]
        self.starts: list[int] | None = starts if split == "val" else None
        # The cursor after the last shard written: [document index, tokens of that document already in
        # shards, documents of this split started so far]. A resumed run continues from it.
        self.cursor: list[int] = list(saved["cursor"])
        self.resume_doc, self.resume_skip, self.documents = self.cursor
        self.doc, self.doc_tokens = -1, 0
        self.buffer: np.ndarray | None = None
        self.fill = 0

    def state(self) -> dict:
        return {"shards": self.shards, "cursor": self.cursor, "done": self.done, "starts": self.starts}

    def wants(self, doc: int) -> bool:
        """Whether document ``doc`` (of this split) still has tokens to write."""
        return not self.done and doc >= self.resume_doc

    def add(self, doc: int, tokens: np.ndarray, first: bool, on_shard) -> None:
        if doc != self.doc:
            self.doc, self.doc_tokens = doc, 0
        if first and doc != self.resume_doc:
            self.documents += 1
            if self.starts is not None:
                self.starts.append(self.written + self.fill)
        if doc == self.resume_doc and self.doc_tokens < self.resume_skip:
            drop = min(self.resume_skip - self.doc_tokens, len(tokens))
            self.doc_tokens += drop
            tokens = tokens[drop:]
        if self.buffer is None:
            self.buffer = np.empty(self.shard_tokens, dtype=self.dtype)
        while len(tokens):
            take = min(self.shard_tokens - self.fill, len(tokens))
            self.buffer[self.fill : self.fill + take] = tokens[:take]
            self.fill += take
            self.doc_tokens += take
            tokens = tokens[take:]
            if self.fill == self.shard_tokens:
                self._write(on_shard)

    def finish(self, on_shard) -> None:
        if self.fill or not self.shards:
            self._write(on_shard)
        self.done = True
        on_shard()

    def _write(self, on_shard) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        tokens = self.buffer[: self.fill] if self.buffer is not None else np.empty(0, self.dtype)
        if len(tokens) == 0 and self.split == "train":
            raise ValueError("the corpus produced no training tokens")
        self.cursor = [self.doc, self.doc_tokens, self.documents]
        if len(tokens):
            path = self.out_dir / name
            write_shard(path, tokens, self.vocab_size)
            self.shards.append(
                {"file": name, "tokens": len(tokens), "sha256": sha256_file(path), "cursor": self.cursor}
            )
            self.written += len(tokens)
        self.fill = 0
        on_shard()


def _count(path: Path) -> int | None:
    """A shard's token count by its header, or None when the header is damaged."""
    try:
        return read_header(path)[1]
    except ValueError:
        return None


def _valid_prefix(out_dir: Path, saved: dict) -> dict:
    """The journalled state of a split, cut back to its last shard that is on disk and intact."""
    good = 0
    for shard in saved["shards"]:
        path = out_dir / shard["file"]
        if not path.exists() or sha256_file(path) != shard["sha256"] or _count(path) != shard["tokens"]:
            break
        good += 1
    if good == len(saved["shards"]):
        return saved
    keep = saved["shards"][:good]
    cursor = keep[-1]["cursor"] if keep else [-1, 0, 0]
    return {"shards": keep, "cursor": cursor, "done": False, "starts": saved.get("starts")}


# -- the pipeline ----------------------------------------------------------------------------------------------


def prepare_dataset(
    corpus: str | Path | Sequence[str | Path] | None,
    out_dir: str | Path,
    tokenizer: str | Path | Tokenizer | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    val_fraction: float = 0.005,
    workers: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    seed: int = 0,
    *,
    val_documents: int = DEFAULT_VAL_DOCUMENTS,
    val_section_chars: int = DEFAULT_VAL_SECTION_CHARS,
    text_field: str = "text",
    strict: bool = False,
    gutenberg: bool = False,
    hub: HubSource | None = None,
    max_documents: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    part: tuple[int, int] | None = None,
    merge: bool = False,
) -> dict:
    """Tokenize a corpus into train/val shards in ``out_dir`` and return the manifest (see the module
    docstring). ``tokenizer``: a path, hub id or Tokenizer; when None, a byte-level BPE of ``vocab_size`` is
    trained on the training documents. ``workers``: tokenizing processes (default: all CPUs).
    ``val_documents`` and ``val_section_chars``: see :func:`plan_validation` (local corpora).

    Across jobs: ``part=(i, n)`` tokenizes only the i-th of n contiguous groups of the corpus files into
    ``out_dir/parts/`` and returns that part's record; ``merge=True`` then joins the n parts into the dataset,
    byte-identical to a single-process run (shards, validation split, manifest but its ``created`` time),
    and removes the parts.
    Both need the same corpus, settings and ``tokenizer`` (a given one: a tokenizer trained on a part would
    differ)."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
    if val_documents < 1:
        raise ValueError(f"val_documents must be at least 1, got {val_documents}")
    if val_section_chars < MIN_VAL_SECTION_CHARS:
        raise ValueError(
            f"val_section_chars must be at least {MIN_VAL_SECTION_CHARS}, got {val_section_chars}"
        )
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    if (corpus is None) == (hub is None):
        raise ValueError("give exactly one of a corpus path and a hub dataset")
    if part is not None or merge:
        what = f"part {part[0]}/{part[1]}" if part else "merge"
        if part is not None and merge:
            raise ValueError("give one of part and merge: parts are prepared first, then merged")
        if hub is not None:
            raise ValueError(
                f"{what}: splitting across jobs needs a local corpus (a hub stream has no files)"
            )
        if tokenizer is None:
            raise ValueError(
                f"{what}: give the tokenizer (--tokenizer): every part must use the same one; train it once "
                "with `tablefree tokenizer train CORPUS --vocab-size V -o tokenizer.json`"
            )
        if part is not None and not 1 <= part[0] <= part[1]:
            raise ValueError(f"part: expected I/N with 1 <= I <= N, got {part[0]}/{part[1]}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    _remove_temp_files(out_dir)

    if hub is None:
        reader = Corpus(corpus, text_field=text_field, strict=strict, gutenberg=gutenberg)
        summary = reader.scan(progress=progress)
        if summary.documents == 0:
            kinds = ", ".join(f"{kind} {n}" for kind, n in summary.as_dict()["junk"].items())
            raise ValueError(
                f"{', '.join(map(str, reader.paths))}: no valid document to prepare (junk: {kinds}); "
                "`tablefree data scan` names each file and line"
            )
        docs = LocalDocuments(reader, summary, val_fraction, seed, val_documents, val_section_chars)
        sources = [asdict(f) for f in summary.files]
    else:
        summary = None
        docs = HubDocuments(hub, text_field, val_fraction, seed, max_documents)
        sources = [{"hub": hub.as_dict(), "max_documents": max_documents}]

    if overwrite:  # only now that the corpus has been read without error
        _clear(out_dir)
    settings = {
        "val_fraction": val_fraction,
        "val_documents": val_documents,
        "val_section_chars": val_section_chars,
        "seed": seed,
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "gutenberg": gutenberg,
        "split_rule": docs.rule,
    }
    tok = _resolve_tokenizer(tokenizer, out_dir, vocab_size, docs)
    tok_hash = tokenizer_hash(tok)
    fingerprint = hashlib.sha256(
        json.dumps(
            {"sources": sources, "settings": settings, "tokenizer_hash": tok_hash}, sort_keys=True
        ).encode()
    ).hexdigest()

    existing = out_dir / MANIFEST
    if existing.exists():
        manifest = read_manifest(out_dir)
        check_tokenizer(manifest.get("tokenizer_hash", ""), tok, f"the dataset in {out_dir}")
        if manifest.get("fingerprint") != fingerprint:
            raise ValueError(
                f"{existing}: this directory holds a dataset prepared from other inputs or settings; "
                "use another --out, or --overwrite"
            )
        if part is not None:
            raise ValueError(f"{existing}: the dataset is complete already; a part of it is not needed")
        return manifest  # already complete
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if part is not None:
        return _prepare_part(
            out_dir, docs, summary, tok, vocab, tok_hash, fingerprint, part, workers, progress
        )
    records = _part_records(out_dir, fingerprint) if merge else []  # checked before anything is written
    state = _load_state(out_dir, tok, fingerprint)
    if tokenizer is not None or not (out_dir / TOKENIZER_FILE).exists():
        save_tokenizer(tok, out_dir / TOKENIZER_FILE)

    writers = {
        split: SplitWriter(
            out_dir, split, shard_tokens, vocab, _valid_prefix(out_dir, state["splits"][split])
        )
        if state
        else SplitWriter(out_dir, split, shard_tokens, vocab, None)
        for split in SPLITS
    }

    def journal() -> None:
        write_json_atomic(
            out_dir / STATE_FILE,
            {
                "fingerprint": fingerprint,
                "tokenizer_hash": tok_hash,
                "splits": {s: w.state() for s, w in writers.items()},
            },
        )

    if merge:  # a merge starts afresh: a killed one left (journalled) shards of its own, never others'
        _clear_shards(out_dir)
        writers = {split: SplitWriter(out_dir, split, shard_tokens, vocab, None) for split in SPLITS}
    if state is None or merge:  # from now on, shards in this directory are ours: a crash before any journal
        journal()  # update must not leave shards that a re-run would take for someone else's
    if merge:
        _merge_parts(out_dir, records, writers, journal)
    else:
        _tokenize(docs, tok, writers, workers, journal, progress)
    for writer in writers.values():
        if not writer.done:
            writer.finish(journal)

    manifest = _manifest(tok, tok_hash, writers, sources, settings, fingerprint, summary, docs, corpus)
    write_json_atomic(out_dir / MANIFEST, manifest)
    (out_dir / STATE_FILE).unlink(missing_ok=True)
    if merge:  # the dataset holds every token of the parts now
        shutil.rmtree(out_dir / PARTS_DIR)
    return manifest


def _resolve_tokenizer(tokenizer, out_dir: Path, vocab_size: int, docs) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    saved = out_dir / TOKENIZER_FILE
    state_path = out_dir / STATE_FILE
    if saved.exists() and (state_path.exists() or (out_dir / MANIFEST).exists()):
        # A resumed run (or a finished one) that trained its own tokenizer: reuse it, as training is slow.
        return load_tokenizer(saved)
    texts = (text for i, text in enumerate(docs.documents(0)) if docs.split_of(i) == "train")
    return train_tokenizer_from_texts(texts, vocab_size, saved)


def _load_state(out_dir: Path, tok: Tokenizer, fingerprint: str) -> dict | None:
    path = out_dir / STATE_FILE
    if not path.exists():
        if any(out_dir.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin")):
            raise ValueError(
                f"{out_dir} holds shards but no manifest or journal; use another --out, or --overwrite"
            )
        return None
    state = read_json(path)
    _check_state(state, path)
    check_tokenizer(state["tokenizer_hash"], tok, f"the interrupted preparation in {out_dir} ({path.name})")
    if state["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path}: an interrupted preparation of other inputs or settings is here; use another --out, "
            "or --overwrite"
        )
    return state


def _check_state(state: object, path: Path) -> None:
    """The journal's shape, so a damaged one is an error naming the field, not a traceback."""

    def fail(name: str, expected: str) -> None:
        raise ValueError(
            f"{path}: field {name!r} {expected}; the journal of the interrupted preparation is damaged: "
            "delete it (the shards are then prepared again) or use --overwrite"
        )

    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and -1 <= value < 2**62

    if not isinstance(state, dict):
        fail("(top level)", "must be a JSON object")
    for key in ("fingerprint", "tokenizer_hash"):
        if not isinstance(state.get(key), str):
            fail(key, "must be a string")
    splits = state.get("splits")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        fail("splits", f"must hold {' and '.join(SPLITS)}")
    for name, split in splits.items():
        if not isinstance(split, dict):
            fail(f"splits.{name}", "must be an object")
        cursor = split.get("cursor")
        if not (isinstance(cursor, list) and len(cursor) == 3 and all(map(is_int, cursor))):
            fail(f"splits.{name}.cursor", "must be three integers")
        if not isinstance(split.get("done"), bool):
            fail(f"splits.{name}.done", "must be true or false")
        starts = split.get("starts")
        if starts is not None and not (isinstance(starts, list) and all(map(is_int, starts))):
            fail(f"splits.{name}.starts", "must be a list of token offsets")
        shards = split.get("shards")
        if not isinstance(shards, list):
            fail(f"splits.{name}.shards", "must be a list")
        for i, shard in enumerate(shards):
            where = f"splits.{name}.shards[{i}]"
            if not isinstance(shard, dict):
                fail(where, "must be an object")
            if shard.get("file") != f"{name}_{i:06d}.bin":
                fail(f"{where}.file", f"must be {name}_{i:06d}.bin")
            if not is_int(shard.get("tokens")) or not isinstance(shard.get("sha256"), str):
                fail(where, "must hold a token count and a sha256")
            c = shard.get("cursor")
            if not (isinstance(c, list) and len(c) == 3 and all(map(is_int, c))):
                fail(f"{where}.cursor", "must be three integers")
        _check_state_split(split, name, fail)


def _check_state_split(split: dict, name: str, fail) -> None:
    """The journal's numbers must agree with each other: a resume from a wrong cursor would silently drop or
    repeat text."""
    shards, cursor = split["shards"], split["cursor"]
    cursors = [shard["cursor"] for shard in shards]
    if any(a > b for a, b in itertools.pairwise(cursors)):
        fail(f"splits.{name}.shards", "must have non-decreasing cursors")
    if shards and cursor != cursors[-1]:
        fail(f"splits.{name}.cursor", "must be the cursor of its last shard")
    if not shards and not split["done"] and cursor != [-1, 0, 0]:
        fail(f"splits.{name}.cursor", "must be [-1, 0, 0] before the first shard")
    starts = split.get("starts")
    if starts:
        if starts[0] != 0 or any(a >= b for a, b in itertools.pairwise(starts)):
            fail(f"splits.{name}.starts", "must start at 0 and increase")
        written = sum(shard["tokens"] for shard in shards)
        if sum(t < written for t in starts) != (cursors[-1][2] if shards else 0):
            fail(f"splits.{name}.starts", "must count the documents its shards hold")


def _clear_shards(out_dir: Path) -> None:
    for path in out_dir.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin"):
        path.unlink()


def _clear(out_dir: Path) -> None:
    for path in [
        *out_dir.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin"),
        out_dir / MANIFEST,
        out_dir / STATE_FILE,
    ]:
        path.unlink(missing_ok=True)


def _remove_temp_files(out_dir: Path) -> None:
    """Temp files of a killed run: never valid, as renaming into place is the last step of every write."""
    for path in out_dir.glob(".*.tmp.*"):
        path.unlink(missing_ok=True)


def _tasks(docs, writers: dict[str, SplitWriter], split_safe: bool) -> Iterator[tuple[list, list, list]]:
    """Tasks of about TASK_CHARS characters: (pieces, first-piece flags, (doc, split) per piece). Documents
    whose split already has them in shards are skipped without tokenizing."""
    active = [w.resume_doc for w in writers.values() if not w.done]
    if not active:
        return
    start = max(0, min(active))
    pieces, firsts, owners, size = [], [], [], 0
    for doc, text in enumerate(docs.documents(start), start=start):
        split = docs.split_of(doc)
        if not writers[split].wants(doc):
            continue
        cuts = [0, *split_points(text, PIECE_CHARS), len(text)] if split_safe else [0, len(text)]
        for i, (a, b) in enumerate(itertools.pairwise(cuts)):
            pieces.append(text[a:b])
            firsts.append(i == 0)
            owners.append((doc, split))
            size += b - a
            if size >= TASK_CHARS:
                yield pieces, firsts, owners
                pieces, firsts, owners, size = [], [], [], 0
    if pieces:
        yield pieces, firsts, owners


def _tokenize(
    docs, tok: Tokenizer, writers: dict[str, SplitWriter], workers: int, journal, progress: bool
) -> None:
    eot = eot_id(tok)
    dtype = writers["train"].dtype
    pool = _make_pool(workers, tok, eot, dtype)
    bar = tqdm(desc="tokenizing", unit="B", unit_scale=True, unit_divisor=1000, disable=not progress)
    pending: deque = deque()
    documents = tokens = 0
    try:
        for task in _tasks(docs, writers, is_split_safe(tok)):
            pending.append((pool.apply_async(_encode_task, ((task[0], task[1]),)), task[1], task[2]))
            while len(pending) > 2 * workers:
                documents, tokens = _consume(pending.popleft(), writers, journal, bar, documents, tokens)
        while pending:
            documents, tokens = _consume(pending.popleft(), writers, journal, bar, documents, tokens)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        bar.close()


def _consume(
    item, writers: dict[str, SplitWriter], journal, bar, documents: int, tokens: int
) -> tuple[int, int]:
    result, firsts, owners = item
    ids, lengths, nbytes = result.get()
    offset = 0
    for length, first, (doc, split) in zip(lengths.tolist(), firsts, owners, strict=True):
        writers[split].add(doc, ids[offset : offset + length], first, journal)
        offset += length
    documents += sum(firsts)
    tokens += offset
    bar.update(nbytes)
    bar.set_postfix(docs=f"{documents:,}", tokens=f"{tokens:,}", refresh=False)
    return documents, tokens


def _manifest(tok, tok_hash, writers, sources, settings, fingerprint, summary, docs, corpus) -> dict:
    splits = {}
    for split, writer in writers.items():
        shards = [{k: s[k] for k in ("file", "tokens", "sha256")} for s in writer.shards]
        splits[split] = {
            "shards": shards,
            "tokens": sum(s["tokens"] for s in shards),
            "documents": writer.documents,
        }
    splits["val"]["document_starts"] = writers["val"].starts or []
    for split in SPLITS:  # the plan and the stream must agree
        if docs.counts is not None and splits[split]["documents"] != docs.counts[split]:
            raise RuntimeError(
                f"{split}: wrote {splits[split]['documents']} documents, planned {docs.counts[split]}"
            )
    vocab = tok.get_vocab_size(with_added_tokens=True)
    junk = summary.as_dict() if summary is not None else {"junk_items": [j.__dict__ for j in docs.junk]}
    return {
        "version": MANIFEST_VERSION,
        "tokenizer_hash": tok_hash,
        "tokenizer_file": TOKENIZER_FILE,
        "vocab_size": vocab,
        "eot_id": eot_id(tok),
        "shard_format": {
            "header": "256 x int32 little-endian: magic 20240520, version, token count",
            "version": version_for_vocab(vocab),
            "dtype": "uint16" if version_for_vocab(vocab) == 1 else "uint32",
        },
        "document_separator": "eot_before_each_document",
        "splits": splits,
        "validation": _validation_record(splits["val"], docs),
        "sources": sources,
        "corpus": {
            "paths": [
                str(Path(p).resolve()) for p in ([corpus] if isinstance(corpus, (str, Path)) else corpus)
            ]
            if corpus is not None
            else None,
            **{k: v for k, v in junk.items()},
        },
        "settings": settings,
        "fingerprint": fingerprint,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _validation_record(val: dict, docs) -> dict:
    """What the validation split holds: documents, tokens, distinct sources and, per document, its token
    range in the split's stream and where its text came from."""
    starts = val["document_starts"]
    bounds = [*starts, val["tokens"]]
    items = docs.validation_items() if isinstance(docs, LocalDocuments) else [{} for _ in starts]
    if len(items) != len(starts):
        raise RuntimeError(f"val: {len(starts)} documents written, {len(items)} planned")
    record = {
        "documents": len(starts),
        "tokens": val["tokens"],
        "rule": docs.rule,
        "items": [
            {"start": a, "tokens": b - a, **item}
            for (a, b), item in zip(itertools.pairwise(bounds), items, strict=True)
        ],
    }
    if isinstance(docs, LocalDocuments):
        record["source_documents"] = docs.plan.sources
        record["sections"] = docs.plan.units - len(docs.plan.whole)
        record["section_chars"] = docs.plan.section_chars
    return record


def verify_dataset_tokenizer(data_dir: str | Path, tokenizer: str | Path | Tokenizer) -> None:
    """Raise a ValueError when ``tokenizer`` is not the one the dataset in ``data_dir`` was prepared with."""
    manifest = read_manifest(data_dir)
    check_tokenizer(manifest["tokenizer_hash"], tokenizer, f"the dataset {data_dir}")


def adopt_shards(
    data_dir: str | Path,
    tokenizer: str | Path | Tokenizer,
    train: Sequence[str | Path],
    val: Sequence[str | Path] = (),
) -> dict:
    """Write a manifest for shards made elsewhere (llm.c, modded-nanogpt: same header and uint16 tokens), so
    ``TokenLoader`` and training read them. The shards must lie in ``data_dir``; each header is checked, and
    ``tokenizer`` (e.g. GPT-2's tokenizer.json for FineWeb shards) is copied in. Document counts are the
    number of EOT tokens, under llm.c's convention that EOT precedes every document."""
    from tablefree.data.shards import open_shard

    data_dir = Path(data_dir)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    eot, vocab = eot_id(tok), tok.get_vocab_size(with_added_tokens=True)
    splits = {}
    for split, files in (("train", train), ("val", val)):
        shards, documents = [], 0
        for file in files:
            path = Path(file) if Path(file).is_absolute() else data_dir / file
            if path.resolve().parent != data_dir.resolve():
                raise ValueError(f"{path}: adopted shards must lie in {data_dir}")
            tokens = open_shard(path)  # checks the header against the file size
            count = len(tokens)
            if count and int(tokens.max()) >= vocab:
                raise ValueError(
                    f"{path}: holds token id {int(tokens.max())}, outside the tokenizer's {vocab}"
                )
            documents += int(np.count_nonzero(tokens == eot))
            shards.append({"file": path.name, "tokens": count, "sha256": sha256_file(path)})
        splits[split] = {"shards": shards, "tokens": sum(s["tokens"] for s in shards), "documents": documents}
    if not splits["train"]["shards"]:
        raise ValueError("adopt_shards needs at least one train shard")
    save_tokenizer(tok, data_dir / TOKENIZER_FILE)
    manifest = {
        "version": MANIFEST_VERSION,
        "tokenizer_hash": tokenizer_hash(tok),
        "tokenizer_file": TOKENIZER_FILE,
        "vocab_size": vocab,
        "eot_id": eot,
        "shard_format": {"header": "256 x int32 little-endian: magic 20240520, version, token count"},
        "document_separator": "eot_before_each_document",
        "splits": splits,
        "sources": [{"adopted": s["file"]} for split in splits.values() for s in split["shards"]],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json_atomic(data_dir / MANIFEST, manifest)
    return manifest


# -- across jobs: parts and their merge -----------------------------------------------------------------------

PARTS_DIR = "parts"  # in the dataset directory: one directory per part, I-of-N
PART_FILE = "part.json"  # written last: its presence marks a finished part
MERGE_CHUNK_TOKENS = 1 << 24


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


def _prepare_part(
    out_dir: Path, docs, summary, tok, vocab: int, tok_hash: str, fingerprint: str, part, workers, progress
) -> dict:
    index, n = part
    first_file, end_file = part_file_ranges(summary, n)[index - 1]
    file_docs = docs.corpus.file_document_ranges()
    first_doc = file_docs[first_file][0]
    end_doc = file_docs[end_file - 1][1] if end_file > first_file else first_doc
    first, end = int(docs.first_unit[first_doc]), int(docs.first_unit[end_doc])
    directory = out_dir / PARTS_DIR / f"{index}-of-{n}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PART_FILE).unlink(missing_ok=True)  # a part is prepared whole, never resumed
    dtype = np.dtype(np.uint16 if version_for_vocab(vocab) == 1 else np.uint32)
    writers = {split: PartWriter(directory, split, dtype, first, end) for split in SPLITS}
    _tokenize(_DocumentRange(docs, end), tok, writers, workers, lambda: None, progress)
    record = {
        "part": [index, n],
        "fingerprint": fingerprint,
        "tokenizer_hash": tok_hash,
        "files": [summary.files[i].file for i in range(first_file, end_file)],
        "stream": [first, end],
        "splits": {split: writer.finish() for split, writer in writers.items()},
    }
    write_json_atomic(directory / PART_FILE, record)
    return record


def _part_records(out_dir: Path, fingerprint: str) -> list[dict]:
    """The finished parts in ``out_dir``, in order: all N of them, of this corpus and settings, contiguous."""
    records = [read_json(path) for path in sorted((out_dir / PARTS_DIR).glob(f"*/{PART_FILE}"))]
    if not records:
        raise FileNotFoundError(
            f"{out_dir / PARTS_DIR}: no finished part; run `data prepare --part I/N` first"
        )
    n = records[0]["part"][1]
    records.sort(key=lambda record: record["part"][0])
    found = [record["part"] for record in records]
    if found != [[i, n] for i in range(1, n + 1)]:
        missing = sorted({i for i in range(1, n + 1)} - {i for i, m in found if m == n})
        raise ValueError(f"{out_dir / PARTS_DIR}: parts of {n} expected, missing {missing} (found {found})")
    end = 0
    for record in records:
        where = out_dir / PARTS_DIR / f"{record['part'][0]}-of-{n}" / PART_FILE
        if record["fingerprint"] != fingerprint:
            raise ValueError(f"{where}: prepared from other inputs, settings or tokenizer than this merge")
        if record["stream"][0] != end:
            raise ValueError(f"{where}: its documents start at {record['stream'][0]}, expected {end}")
        end = record["stream"][1]
    return records


def _merge_parts(out_dir: Path, records: list[dict], writers: dict[str, SplitWriter], journal) -> None:
    """Feed every part's streams, in order, to the dataset's shard writers, as a single run feeds them."""
    n = len(records)
    for split, writer in writers.items():
        for record in records:
            info = record["splits"][split]
            path = out_dir / PARTS_DIR / f"{record['part'][0]}-of-{n}" / info["file"]
            if (
                path.stat().st_size != info["tokens"] * writer.dtype.itemsize
                or sha256_file(path) != info["sha256"]
            ):
                raise ValueError(f"{path}: does not match its {PART_FILE} (damaged or changed)")
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
