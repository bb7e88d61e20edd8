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

The jobs, one module each: the split plan (``documents.py``), tokenizing in worker processes
(``tokenizing.py``), shards and the resume journal (``writer.py``), preparing across jobs (``parts.py``); this
module runs them in order and writes the manifest.

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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tablefree.data.corpus import Corpus
from tablefree.data.decoding import DEFAULT_MAX_EXPANSION
from tablefree.data.documents import (
    DEFAULT_VAL_DOCUMENTS,
    DEFAULT_VAL_SECTION_CHARS,
    MIN_VAL_SECTION_CHARS,
    SPLITS,
    HubDocuments,
    HubSource,
    LocalDocuments,
)
from tablefree.data.loader import MANIFEST, read_manifest
from tablefree.data.parts import PARTS_DIR, checked_parts, merge_parts, prepare_part
from tablefree.data.shards import dtype_for_vocab, version_for_vocab
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
    "DEFAULT_VAL_SECTION_CHARS",
    "DEFAULT_VOCAB_SIZE",
    "PARTS_DIR",
    "STATE_FILE",
    "TOKENIZER_FILE",
    "HubSource",
    "adopt_shards",
    "prepare_dataset",
    "verify_dataset_tokenizer",
]

MANIFEST_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_SHARD_TOKENS = 100_000_000  # as llm.c's and modded-nanogpt's FineWeb shards
DEFAULT_VOCAB_SIZE = 32_768


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
    max_expansion: float = DEFAULT_MAX_EXPANSION,
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
    ``val_documents`` and ``val_section_chars``: see :func:`tablefree.data.documents.plan_validation` (local
    corpora). ``max_expansion``: see :class:`tablefree.data.corpus.Corpus` (it changes nothing it does not refuse).

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
    remove_temp_files(out_dir)

    if hub is None:
        reader = Corpus(
            corpus, text_field=text_field, strict=strict, gutenberg=gutenberg, max_expansion=max_expansion
        )
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
        clear_dataset(out_dir)
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
    inputs = {"sources": sources, "settings": settings, "tokenizer_hash": tok_hash}
    fingerprint = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()

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
        return prepare_part(out_dir, docs, summary, tok, vocab, inputs, fingerprint, part, workers, progress)
    # every part checked before anything is written: a refused merge leaves the directory as it was
    records = checked_parts(out_dir, inputs, fingerprint, dtype_for_vocab(vocab)) if merge else []
    state = load_state(out_dir, tok, fingerprint)
    if tokenizer is not None or not (out_dir / TOKENIZER_FILE).exists():
        save_tokenizer(tok, out_dir / TOKENIZER_FILE)

    writers = {
        split: SplitWriter(out_dir, split, shard_tokens, vocab, valid_prefix(out_dir, state["splits"][split]))
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
        clear_shards(out_dir)
        writers = {split: SplitWriter(out_dir, split, shard_tokens, vocab, None) for split in SPLITS}
    if state is None or merge:  # from now on, shards in this directory are ours: a crash before any journal
        journal()  # update must not leave shards that a re-run would take for someone else's
    if merge:
        merge_parts(out_dir, records, writers, journal)
    else:
        tokenize_documents(docs, tok, writers, workers, journal, progress)
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
