"""``prepare_dataset``: corpus → tokenizer → train/val token shards + ``manifest.json``.

Layout of a prepared dataset directory::

    tokenizer.json          # copy of the tokenizer (its sha256 of to_str() is the manifest's tokenizer_hash)
    train_000000.bin ...    # llm.c / modded-nanogpt shards (see tablefree.data.shards)
    val_000000.bin ...
    manifest.json           # written LAST: its presence marks a complete dataset

Each document becomes ``[EOT] + tokens(document)`` (llm.c's convention: the end-of-text token *precedes*
every document, so it separates documents). Which text goes to ``val`` is :mod:`tablefree.data.documents`'s
plan (seeded; for a streamed hub dataset, each document's index hashed with the seed). Each split's token
stream is cut into shards of exactly ``shard_tokens`` tokens (the last one shorter), so shard boundaries depend
only on the inputs and settings.

What is asked is one typed :class:`PrepareSpec`, checked once (from ``prepare_dataset``'s arguments, the CLI's
flags or a compare config's ``dataset:`` block); a single run (:func:`prepare_single`), a part
(:func:`prepare_part`) and a merge (:func:`merge_parts`) are three functions over it. The jobs, one module each:
which text goes to which split (``documents.py``), tokenizing in worker processes (``tokenizing.py``), shards and
the resume journal (``writer.py``), the parts' files and checks (``parts.py``), the parts' records (``records.py``);
this module runs them in order and writes the manifest.

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
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tablefree.data.corpus import Corpus, CorpusSummary, PieceInfo
from tablefree.data.decoding import DEFAULT_MAX_EXPANSION
from tablefree.data.documents import (
    DEFAULT_VAL_DOCUMENTS,
    DEFAULT_VAL_MAX_TOKENS,
    DEFAULT_VAL_SECTION_CHARS,
    HUB_POSITION,
    KEYED_HASH_POSITION,
    KEYED_HASH_RULE,
    MIN_VAL_SECTION_CHARS,
    PLAN_RULE,
    SPLIT_RULES,
    SPLITS,
    HubDocuments,
    HubFiles,
    HubSource,
    KeyedHashDocuments,
    LocalDocuments,
    hub_data_files,
    validation_share,
)
from tablefree.data.parts import (
    PART_FILE,
    PARTS_DIR,
    PartWriter,
    checked_parts,
    feed_parts,
    file_sizes,
    part_dir,
    part_lock,
    piece_key,
)
from tablefree.data.records import MANIFEST, read_manifest, read_part_record
from tablefree.data.shards import dtype_for_vocab, open_shard, version_for_vocab
from tablefree.data.spans import DEFAULT_SPAN_BYTES, Piece, Span, plan_pieces
from tablefree.data.tokenizer import (
    check_tokenizer,
    eot_id,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
    train_tokenizer_from_texts,
)
from tablefree.data.tokenizing import tokenize_documents
from tablefree.data.writer import (
    STATE_FILE,
    SplitWriter,
    clear_dataset,
    clear_shards,
    load_state,
    remove_temp_files,
    valid_prefix,
)
from tablefree.fileio import sha256_file, write_json_atomic

__all__ = [  # the Python API of `data prepare`, `data merge` and `data adopt` (docs/data.md)
    "DEFAULT_SHARD_TOKENS",
    "DEFAULT_VAL_DOCUMENTS",
    "DEFAULT_VAL_MAX_TOKENS",
    "DEFAULT_VAL_SECTION_CHARS",
    "DEFAULT_VOCAB_SIZE",
    "KEYED_HASH_RULE",
    "PARTS_DIR",
    "PLAN_RULE",
    "STATE_FILE",
    "TOKENIZER_FILE",
    "HubSource",
    "PrepareSpec",
    "adopt_shards",
    "merge_parts",
    "prepare_dataset",
    "prepare_part",
    "prepare_single",
    "verify_dataset_tokenizer",
]

MANIFEST_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_SHARD_TOKENS = 100_000_000  # as llm.c's and modded-nanogpt's FineWeb shards
DEFAULT_VOCAB_SIZE = 32_768
# A plan run scanning more documents than this is told of the keyed-hash rule: the plan keeps a number per document
# and cannot be split into parts.
PLAN_NOTE_DOCUMENTS = 10_000_000


@dataclass(frozen=True)
class PrepareSpec:
    """What a preparation is asked to do, checked once when built. ``corpus`` (local paths) or ``hub``;
    ``tokenizer``: a path, hub id or Tokenizer (None: a byte-level BPE of ``vocab_size`` is trained on the training
    documents); ``split_rule``: ``plan`` (the seeded plan over all documents, the rule of every dataset prepared
    before the keyed hash; single runs only) or ``keyed-hash`` (decided per document: what parts need, with the
    validation cap ``val_max_tokens``); ``val_documents``, ``val_section_chars``: see
    :mod:`tablefree.data.documents`; ``max_expansion``: see :class:`tablefree.data.corpus.Corpus` (it changes
    nothing it does not refuse); ``workers``: tokenizing processes (None: all CPUs)."""

    corpus: tuple[str, ...] = ()
    hub: HubSource | None = None
    tokenizer: str | Path | Tokenizer | None = None
    vocab_size: int = DEFAULT_VOCAB_SIZE
    split_rule: str = PLAN_RULE
    val_fraction: float = 0.005
    val_documents: int = DEFAULT_VAL_DOCUMENTS
    val_section_chars: int = DEFAULT_VAL_SECTION_CHARS
    val_max_tokens: int = DEFAULT_VAL_MAX_TOKENS
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    seed: int = 0
    text_field: str = "text"
    strict: bool = False
    gutenberg: bool = False
    max_expansion: float = DEFAULT_MAX_EXPANSION
    span_bytes: int = DEFAULT_SPAN_BYTES
    max_documents: int | None = None
    workers: int | None = None
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        corpus = self.corpus
        paths = (corpus,) if isinstance(corpus, (str, Path)) else tuple(corpus or ())
        object.__setattr__(self, "corpus", tuple(map(str, paths)))
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction must lie in [0, 1), got {self.val_fraction}")
        if self.val_documents < 1:
            raise ValueError(f"val_documents must be at least 1, got {self.val_documents}")
        if self.val_section_chars < MIN_VAL_SECTION_CHARS:
            raise ValueError(
                f"val_section_chars must be at least {MIN_VAL_SECTION_CHARS}, got {self.val_section_chars}"
            )
        if self.val_max_tokens < 1:
            raise ValueError(f"val_max_tokens must be positive, got {self.val_max_tokens}")
        if self.shard_tokens < 1:
            raise ValueError(f"shard_tokens must be positive, got {self.shard_tokens}")
        if self.span_bytes < 1:
            raise ValueError(f"span_bytes must be positive, got {self.span_bytes}")
        if self.split_rule not in SPLIT_RULES:
            raise ValueError(f"split_rule must be one of {', '.join(SPLIT_RULES)}, got {self.split_rule!r}")
        if bool(self.corpus) == (self.hub is not None):
            raise ValueError("give exactly one of a corpus path and a hub dataset")

    def reader(self, pieces: list[Piece] | None = None) -> Corpus:
        """The corpus (or the pieces ``pieces`` of its files), keeping document lengths only for the plan, read in
        spans only under the keyed-hash rule (the plan reads whole files, as it always has)."""
        keyed = self.split_rule == KEYED_HASH_RULE
        return Corpus(
            list(self.corpus),
            text_field=self.text_field,
            strict=self.strict,
            gutenberg=self.gutenberg,
            max_expansion=self.max_expansion,
            span_bytes=self.span_bytes if keyed else None,
            pieces=pieces,
            lengths=not keyed,
        )

    def plan(self, listing: Corpus, n: int) -> list[list[Piece]]:
        """The pieces of each of ``n`` parts: the listed files' spans (sizes, parquet footers and compressed files'
        recorded lengths, no text) cut into ``n`` contiguous runs of about equal weight. ``listing``: the whole
        corpus, ``reader()``, whose spans are reused (each parquet footer is read once)."""
        pieces = listing.pieces
        if listing.span_bytes != self.span_bytes or [(p.file, p.first, p.end) for p in pieces] != [
            (i, 0, p.count) for i, p in enumerate(pieces)
        ]:
            raise ValueError("plan: give the whole corpus as this spec reads it (reader()), not a part of it")
        return plan_pieces(listing.spans, n)

    def share(self, reader: Corpus) -> float:
        """The keyed-hash rule's share of the text held out, from the corpus files' sizes (every part knows them)."""
        corpus_bytes = sum(file_sizes(reader.listed))
        return validation_share(self.val_fraction, self.val_documents, self.val_section_chars, corpus_bytes)

    def settings(self, rule: str) -> dict:
        """The manifest's ``settings`` (part of the fingerprint). ``rule``: what the split records; for the plan
        and the hub hash, the description datasets have always recorded, so their fingerprints stay the same."""
        settings = {
            "val_fraction": self.val_fraction,
            "val_documents": self.val_documents,
            "val_section_chars": self.val_section_chars,
            "seed": self.seed,
            "shard_tokens": self.shard_tokens,
            "text_field": self.text_field,
            "gutenberg": self.gutenberg,
            "split_rule": rule,
        }
        if rule == KEYED_HASH_RULE:
            settings["val_max_tokens"] = self.val_max_tokens
            settings["position"] = KEYED_HASH_POSITION if self.hub is None else HUB_POSITION
            if self.hub is None:
                settings["span_bytes"] = self.span_bytes
        return settings

    def across_jobs(self, what: str) -> None:
        """Refuse, naming ``what``, a part or merge this spec cannot make."""
        if self.tokenizer is None:
            raise ValueError(
                f"{what}: give the tokenizer (--tokenizer): every part must use the same one; train it once "
                "with `tablefree tokenizer train CORPUS --vocab-size V -o tokenizer.json`"
            )
        if self.hub is not None and self.split_rule != KEYED_HASH_RULE:
            raise ValueError(
                f"{what}: parts of a hub dataset need --split-rule {KEYED_HASH_RULE}: its default rule hashes each "
                "document's index in the whole stream, which a part of it cannot know"
            )
        if self.hub is not None:
            hub_data_files(self.hub)  # refused without them
            if self.max_documents is not None:
                raise ValueError(
                    f"{what}: --max-documents counts documents across the whole stream, which a part of it cannot "
                    "know; leave it out, or choose fewer --hub-data-files"
                )
        if self.split_rule != KEYED_HASH_RULE:
            raise ValueError(
                f"{what}: parts need --split-rule {KEYED_HASH_RULE} (split_rule={KEYED_HASH_RULE!r}): the "
                f"{self.split_rule!r} rule plans the split over every document's length, so each part would read "
                "the whole corpus; give the same rule to every part, the merge and any single run to compare"
            )


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
    part: tuple[int, int] | None = None,
    merge: bool = False,
    **options,
) -> dict:
    """Tokenize a corpus into train/val shards in ``out_dir`` and return the manifest (see the module docstring):
    the arguments make a :class:`PrepareSpec` (``options``: its other fields, by name).

    Across jobs: ``part=(i, n)`` tokenizes only the i-th of n groups of the corpus files into ``out_dir/parts/``
    and returns that part's record (as a manifest-like dict: ``part``, ``splits``); ``merge=True`` then joins the
    n parts into the dataset, byte-identical to a single-process run (shards, validation split, manifest but its
    ``created`` time), and removes the parts. Both need the same corpus, settings, ``split_rule="keyed-hash"``
    and ``tokenizer`` (a given one: a tokenizer trained on a part would differ)."""
    spec = PrepareSpec(
        corpus=() if corpus is None else corpus,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        val_fraction=val_fraction,
        workers=workers,
        shard_tokens=shard_tokens,
        seed=seed,
        **options,
    )
    if part is not None and merge:
        raise ValueError("give one of part and merge: parts are prepared first, then merged")
    if part is not None:
        return prepare_part(spec, out_dir, part)
    if merge:
        return merge_parts(spec, out_dir)
    return prepare_single(spec, out_dir)


def _documents(spec: PrepareSpec, reader: Corpus | None, summary: CorpusSummary | None):
    if spec.hub is not None and spec.split_rule == KEYED_HASH_RULE:
        files = HubFiles(spec.hub, hub_data_files(spec.hub), spec.text_field, spec.max_documents)
        return _hub_documents(spec, files)
    if spec.hub is not None:
        return HubDocuments(spec.hub, spec.text_field, spec.val_fraction, spec.seed, spec.max_documents)
    if spec.split_rule == KEYED_HASH_RULE:
        return KeyedHashDocuments(reader, spec.share(reader), spec.val_section_chars, spec.seed)
    return LocalDocuments(
        reader, summary, spec.val_fraction, spec.seed, spec.val_documents, spec.val_section_chars
    )


def _scanned(spec: PrepareSpec, reader: Corpus) -> CorpusSummary:
    summary = reader.scan(progress=spec.progress)
    if summary.documents == 0 and reader.sources == reader.listed:
        kinds = ", ".join(f"{kind} {n}" for kind, n in summary.as_dict()["junk"].items())
        first = "".join(f"; {junk}" for junk in summary.junk[:3])
        raise ValueError(
            f"{', '.join(map(str, reader.paths))}: no valid document to prepare (junk: {kinds}{first}); "
            "`tablefree data scan` names each file and line"
        )
    return summary


def prepare_single(spec: PrepareSpec, out_dir: str | Path) -> dict:
    """The dataset in one process (resumable: see the module docstring); returns the manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_temp_files(out_dir)
    if spec.hub is None:
        reader = spec.reader()
        summary = _scanned(spec, reader)
        sources = [f.record() for f in summary.files]
        if spec.split_rule == PLAN_RULE and summary.documents > PLAN_NOTE_DOCUMENTS:
            print(
                f"note: {summary.documents:,} documents: for a corpus this large pass --split-rule {KEYED_HASH_RULE} "
                "(it keeps nothing per document and splits into --part jobs); the default plan rule is for "
                "reproducing the shipped studies' data",
                file=sys.stderr,
            )
    else:
        reader = summary = None
        sources = [{"hub": spec.hub.as_dict(), "max_documents": spec.max_documents}]
    docs = _documents(spec, reader, summary)
    if spec.overwrite:  # only now that the corpus has been read without error
        clear_dataset(out_dir)
    settings = spec.settings(docs.rule if docs.rule == KEYED_HASH_RULE else docs.description)
    tok = _resolve_tokenizer(spec.tokenizer, out_dir, spec.vocab_size, docs)
    fingerprint = _fingerprint(sources, settings, tokenizer_hash(tok))
    finished = _finished(out_dir, tok, fingerprint)
    if finished is not None:
        return finished
    state = load_state(out_dir, tok, fingerprint)
    if spec.tokenizer is not None or not (out_dir / TOKENIZER_FILE).exists():
        save_tokenizer(tok, out_dir / TOKENIZER_FILE)
    writers, journal = _writers(out_dir, spec, tok, settings, fingerprint, state)
    if state is None:  # from now on, shards in this directory are ours: a crash before any journal update
        journal()  # must not leave shards that a re-run would take for someone else's
    tokenize_documents(docs, tok, writers, spec.workers or os.cpu_count() or 1, journal, spec.progress)
    return _finish(out_dir, spec, tok, writers, journal, sources, settings, fingerprint, summary, docs)


def prepare_part(spec: PrepareSpec, out_dir: str | Path, part: tuple[int, int]) -> dict:
    """Tokenize part ``part`` = (I, N) of the corpus (its own pieces only: files, row groups, byte ranges; of a hub
    dataset, its data files) into ``out_dir/parts/I-of-N/`` and return its record (``part.json``) with ``splits``."""
    index, n = part
    what = f"part {index}/{n}"
    spec.across_jobs(what)
    if not 1 <= index <= n:
        raise ValueError(f"part: expected I/N with 1 <= I <= N, got {index}/{n}")
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).exists():
        raise ValueError(f"{out_dir / MANIFEST}: the dataset is complete already; a part of it is not needed")
    if spec.hub is None:
        listing = spec.reader()
        reader = spec.reader(spec.plan(listing, n)[index - 1])
        summary = _scanned(spec, reader)
        docs = KeyedHashDocuments(reader, spec.share(listing), spec.val_section_chars, spec.seed)
        corpus_bytes = sum(file_sizes(listing.listed))
    else:
        files, sizes = _hub_files(spec.hub)
        share = [files[p.file] for p in plan_pieces(_hub_spans(sizes), n)[index - 1]]
        docs = _hub_documents(spec, HubFiles(spec.hub, share, spec.text_field))
        corpus_bytes = sum(sizes)
    tok = load_tokenizer(spec.tokenizer) if not isinstance(spec.tokenizer, Tokenizer) else spec.tokenizer
    dtype = dtype_for_vocab(tok.get_vocab_size(with_added_tokens=True))
    directory = part_dir(out_dir, index, n)
    directory.mkdir(parents=True, exist_ok=True)
    with part_lock(directory, index, n):
        (directory / PART_FILE).unlink(missing_ok=True)  # a part is prepared whole, never resumed
        writers = {
            split: PartWriter(directory, split, dtype, spec.val_max_tokens if split == "val" else None)
            for split in SPLITS
        }
        tokenize_documents(
            docs, tok, writers, spec.workers or os.cpu_count() or 1, lambda: None, spec.progress
        )
        if spec.hub is None:
            pieces, junk = summary.pieces, summary.junk_log
        else:  # a hub stream is counted as it is read
            hub = docs.corpus
            pieces = [
                PieceInfo(file, sizes[files.index(file)], None, hub.documents.get(file, 0))
                for file in hub.files
            ]
            junk = hub.junk
        record = {
            "part": [index, n],
            "split_rule": KEYED_HASH_RULE,
            "tokenizer_hash": tokenizer_hash(tok),
            "settings": spec.settings(KEYED_HASH_RULE),
            "corpus_bytes": corpus_bytes,
            "pieces": [asdict(p) for p in pieces],
            "junk": [asdict(j) for j in junk.items],
            "junk_counts": junk.counts,
            "splits": {split: writer.finish() for split, writer in writers.items()},
        }
        write_json_atomic(directory / PART_FILE, record)
    return record


def merge_parts(spec: PrepareSpec, out_dir: str | Path) -> dict:
    """Join the N parts in ``out_dir/parts/`` into the dataset (every part checked before anything is written; no
    corpus text read) and return its manifest; the parts are removed once the dataset holds their tokens."""
    spec.across_jobs("merge")
    out_dir = Path(out_dir)
    remove_temp_files(out_dir)
    tok = load_tokenizer(spec.tokenizer) if not isinstance(spec.tokenizer, Tokenizer) else spec.tokenizer
    tok_hash = tokenizer_hash(tok)
    settings = spec.settings(KEYED_HASH_RULE)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    listing = spec.reader() if spec.hub is None else None
    if (out_dir / MANIFEST).exists() and not (out_dir / PARTS_DIR).exists():
        return _finished_or_refused(out_dir, tok, settings, spec, listing)
    parts = _parts_found(out_dir) or 0
    if listing is not None:
        sizes = file_sizes(listing.listed)
        expected = [
            [piece_key(listing.listed[p.file].rel, sizes[p.file], p) for p in pieces]
            for pieces in (spec.plan(listing, parts) if parts else [])
        ]
    else:
        files, sizes = _hub_files(spec.hub)
        expected = [
            [(files[p.file], sizes[p.file], None) for p in pieces]
            for pieces in (plan_pieces(_hub_spans(sizes), parts) if parts else [])
        ]
    records, summary = checked_parts(
        out_dir, expected, sum(sizes), settings, tok_hash, dtype_for_vocab(vocab)
    )
    if summary.documents == 0:
        where = spec.hub.name if spec.hub is not None else ", ".join(map(str, listing.paths))
        raise ValueError(
            f"{where}: no valid document to prepare; `tablefree data scan` names each file and line"
        )
    if listing is not None:
        sources = [f.record() for f in summary.files]
        docs = KeyedHashDocuments(listing, spec.share(listing), spec.val_section_chars, spec.seed)
    else:  # as a single keyed-hash run of the hub dataset records it: the stream and what it skipped
        sources = [{"hub": spec.hub.as_dict(), "max_documents": spec.max_documents}]
        docs = _hub_documents(spec, HubFiles(spec.hub, files, spec.text_field))
        docs.corpus.junk = summary.junk_log
        summary = None
    fingerprint = _fingerprint(sources, settings, tok_hash)
    if spec.overwrite:
        clear_dataset(out_dir)
    finished = _finished(out_dir, tok, fingerprint)
    if finished is not None:
        return finished
    load_state(out_dir, tok, fingerprint)  # refuses another preparation's journal
    save_tokenizer(tok, out_dir / TOKENIZER_FILE)
    clear_shards(
        out_dir
    )  # a merge starts afresh: a killed one left (journalled) shards of its own, never others'
    writers, journal = _writers(out_dir, spec, tok, settings, fingerprint, None)
    journal()
    feed_parts(out_dir, records, writers, journal)
    manifest = _finish(out_dir, spec, tok, writers, journal, sources, settings, fingerprint, summary, docs)
    shutil.rmtree(out_dir / PARTS_DIR)  # the dataset holds every token of the parts now
    return manifest


def _hub_files(source: HubSource) -> tuple[list[str], list[int]]:
    """A hub source's data files and their sizes (a local file's on disk; 0 for one that is not local)."""
    files = hub_data_files(source)
    sizes = []
    for file in files:
        try:
            sizes.append(os.stat(file).st_size)
        except OSError:
            sizes.append(0)
    return files, sizes


def _hub_spans(sizes: list[int]) -> list[list[Span]]:
    """One whole span per data file, weighed by its size when every file is local (else all alike: a remote
    file's size is not asked for)."""
    weights = sizes if all(sizes) else [1] * len(sizes)
    return [[Span(0, size, weight, whole=True)] for size, weight in zip(sizes, weights, strict=True)]


def _hub_documents(spec: PrepareSpec, files: HubFiles) -> KeyedHashDocuments:
    """The keyed-hash rule over a hub dataset's data files: share ``val_fraction`` (the files' text is not
    sized before it is streamed)."""
    return KeyedHashDocuments(files, spec.val_fraction, spec.val_section_chars, spec.seed, HUB_POSITION)


def _parts_found(out_dir: Path) -> int | None:
    """N of the parts in ``out_dir`` (the first one's record says; :func:`checked_parts` checks them all)."""
    paths = sorted((out_dir / PARTS_DIR).glob(f"*/{PART_FILE}"))
    return read_part_record(paths[0]).part[1] if paths else None


def _fingerprint(sources: list[dict], settings: dict, tok_hash: str) -> str:
    inputs = {"sources": sources, "settings": settings, "tokenizer_hash": tok_hash}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _finished(out_dir: Path, tok: Tokenizer, fingerprint: str) -> dict | None:
    """The complete dataset in ``out_dir`` when it is this one; an error when it is another; None when none."""
    existing = out_dir / MANIFEST
    if not existing.exists():
        return None
    manifest = read_manifest(out_dir)
    check_tokenizer(manifest.get("tokenizer_hash", ""), tok, f"the dataset in {out_dir}")
    if manifest.get("fingerprint") != fingerprint:
        raise ValueError(
            f"{existing}: this directory holds a dataset prepared from other inputs or settings; "
            "use another --out, or --overwrite"
        )
    return manifest


def _finished_or_refused(
    out_dir: Path, tok: Tokenizer, settings: dict, spec: PrepareSpec, listing: Corpus | None
) -> dict:
    """A merge run again after it finished (the parts are gone): the dataset, when of this tokenizer, these
    settings and a corpus of these files and sizes (its files' sha256 were the parts' to read), or this hub
    source."""
    manifest = read_manifest(out_dir)
    check_tokenizer(manifest.get("tokenizer_hash", ""), tok, f"the dataset in {out_dir}")
    if listing is None:
        recorded: list = manifest.get("sources") or []
        listed: list = [{"hub": spec.hub.as_dict(), "max_documents": spec.max_documents}]
    else:
        recorded = [(s.get("file"), s.get("bytes")) for s in manifest.get("sources") or []]
        listed = [(s.rel, size) for s, size in zip(listing.listed, file_sizes(listing.listed), strict=True)]
    if manifest.get("settings") != settings or recorded != listed:
        raise ValueError(
            f"{out_dir / MANIFEST}: this directory holds a dataset prepared from other inputs or settings; "
            "use another --out, or --overwrite"
        )
    return manifest


def _writers(
    out_dir: Path, spec: PrepareSpec, tok: Tokenizer, settings: dict, fingerprint: str, state: dict | None
) -> tuple[dict[str, SplitWriter], Callable[[], None]]:
    """The two splits' shard writers (resumed from ``state``) and the journal that records them."""
    vocab = tok.get_vocab_size(with_added_tokens=True)
    cap = spec.val_max_tokens if settings["split_rule"] == KEYED_HASH_RULE else None
    writers = {
        split: SplitWriter(
            out_dir,
            split,
            spec.shard_tokens,
            vocab,
            valid_prefix(out_dir, state["splits"][split]) if state else None,
            cap if split == "val" else None,
        )
        for split in SPLITS
    }
    tok_hash = tokenizer_hash(tok)

    def journal() -> None:
        write_json_atomic(
            out_dir / STATE_FILE,
            {
                "fingerprint": fingerprint,
                "tokenizer_hash": tok_hash,
                "splits": {s: w.state() for s, w in writers.items()},
            },
        )

    return writers, journal


def _finish(out_dir, spec, tok, writers, journal, sources, settings, fingerprint, summary, docs) -> dict:
    """The last shards, then the manifest (last: its presence marks a complete dataset)."""
    for writer in writers.values():
        if not writer.done:
            writer.finish(journal)
    manifest = _manifest(tok, writers, sources, settings, fingerprint, summary, docs, spec.corpus or None)
    write_json_atomic(out_dir / MANIFEST, manifest)
    (out_dir / STATE_FILE).unlink(missing_ok=True)
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
    texts = (text for text, split, _ in docs.stream(0) if split == "train")
    return train_tokenizer_from_texts(texts, vocab_size, saved)


def _manifest(tok, writers, sources, settings, fingerprint, summary, docs, corpus) -> dict:
    tok_hash = tokenizer_hash(tok)
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
    junk = summary.as_dict() if summary is not None else docs.junk.as_dict()
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
        "validation": _validation_record(splits["val"], docs, writers["val"]),
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


def _validation_record(val: dict, docs, writer: SplitWriter) -> dict:
    """What the validation split holds: documents, tokens, distinct sources and, per document, its token
    range in the split's stream and where its text came from."""
    starts = val["document_starts"]
    bounds = [*starts, val["tokens"]]
    if isinstance(docs, LocalDocuments):
        items = docs.validation_items()
    elif isinstance(docs, KeyedHashDocuments):
        items = writer.items
    else:
        items = [{} for _ in starts]
    if len(items) != len(starts):
        raise RuntimeError(f"val: {len(starts)} documents written, {len(items)} planned")
    record = {
        "documents": len(starts),
        "tokens": val["tokens"],
        "rule": docs.description,
        "items": [
            {"start": a, "tokens": b - a, **item}
            for (a, b), item in zip(itertools.pairwise(bounds), items, strict=True)
        ],
    }
    if isinstance(docs, LocalDocuments):
        record["source_documents"] = docs.plan.sources
        record["sections"] = docs.plan.units - len(docs.plan.whole)
        record["section_chars"] = docs.plan.section_chars
    if isinstance(docs, KeyedHashDocuments):  # each source document gives at most one validation document
        record["source_documents"] = len(items)
        record["sections"] = sum(1 for item in items if not item["whole"])
        record["section_chars"] = docs.section_chars
        record["share"] = docs.share
        record["max_tokens"] = writer.max_tokens
        record["dropped_documents"] = writer.dropped
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
