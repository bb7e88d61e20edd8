"""Writing a split's token stream as shards, and the journal that lets an interrupted preparation resume.

Every shard is written atomically, and after each one the journal (``.prepare-state.json``) records it with its
sha256 and the resume cursor of its split (the document and the number of that document's tokens already
written). A re-run keeps the journalled shards that are still intact (:func:`valid_prefix`) and continues from
the earliest cursor.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tablefree.data.documents import SPLITS
from tablefree.data.loader import MANIFEST
from tablefree.data.shards import dtype_for_vocab, read_header, write_shard
from tablefree.data.tokenizer import check_tokenizer
from tablefree.fileio import read_json, sha256_file

STATE_FILE = ".prepare-state.json"


class SplitWriter:
    """Accumulates one split's token stream and writes it as fixed-size shards, journalling each."""

    def __init__(
        self,
        out_dir: Path,
        split: str,
        shard_tokens: int,
        vocab_size: int,
        saved: dict | None,
        max_tokens: int | None = None,
    ) -> None:
        self.out_dir, self.split, self.shard_tokens, self.vocab_size = (
            out_dir,
            split,
            shard_tokens,
            vocab_size,
        )
        self.dtype = dtype_for_vocab(vocab_size)
        saved = saved or {"shards": [], "cursor": [-1, 0, 0], "done": False, "starts": []}
        self.shards: list[dict] = saved["shards"]
        self.done: bool = saved["done"]
        self.written = sum(s["tokens"] for s in self.shards)
        # Stream offset of each document's first token (its EOT), for val only: an evaluator's per-document
        # losses need them, and train's could be millions long.
        # The journal may hold starts of documents not yet in a shard: those are written again on resume.
        starts = [t for t in saved.get("starts") or [] if t < self.written]
        self.starts: list[int] | None = starts if split == "val" else None
        # Where each document came from (the keyed-hash rule's validation records), one per start.
        self.items: list[dict] = list(saved.get("items") or [])[: len(starts)]
        # The cap (keyed-hash val): a document starting after the split holds max_tokens is left out, counted.
        # A journal's count stands only once the split is done: before that, the re-read documents count again.
        self.max_tokens = max_tokens
        self.dropped: int = saved.get("dropped", 0) if self.done else 0
        self.dropping = -1
        # The cursor after the last shard written: [document index, tokens of that document already in
        # shards, documents of this split started so far]. A resumed run continues from it.
        self.cursor: list[int] = list(saved["cursor"])
        self.resume_doc, self.resume_skip, self.documents = self.cursor
        self.doc, self.doc_tokens = -1, 0
        self.buffer: np.ndarray | None = None
        self.fill = 0

    def state(self) -> dict:
        state = {"shards": self.shards, "cursor": self.cursor, "done": self.done, "starts": self.starts}
        return {**state, "items": self.items, "dropped": self.dropped} if self.split == "val" else state

    def wants(self, doc: int) -> bool:
        """Whether document ``doc`` (of this split) still has tokens to write."""
        return not self.done and doc >= self.resume_doc

    def add(self, doc: int, tokens: np.ndarray, first: bool, on_shard, where: dict | None = None) -> None:
        if first and doc != self.resume_doc and over_cap(self.written + self.fill, self.max_tokens):
            self.dropping = doc
            self.dropped += 1
        if doc == self.dropping:
            return
        if doc != self.doc:
            self.doc, self.doc_tokens = doc, 0
        if first and doc != self.resume_doc:
            self.documents += 1
            if self.starts is not None:
                self.starts.append(self.written + self.fill)
            if where is not None:
                self.items.append(where)
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


def over_cap(tokens: int, max_tokens: int | None) -> bool:
    """Whether a document starting after ``tokens`` tokens of its split is left out by the cap."""
    return max_tokens is not None and tokens >= max_tokens


def _count(path: Path) -> int | None:
    """A shard's token count by its header, or None when the header is damaged."""
    try:
        return read_header(path)[1]
    except ValueError:
        return None


def valid_prefix(out_dir: Path, saved: dict) -> dict:
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
    return {
        "shards": keep,
        "cursor": cursor,
        "done": False,
        "starts": saved.get("starts"),
        "items": saved.get("items"),
    }


def load_state(out_dir: Path, tok: Tokenizer, fingerprint: str) -> dict | None:
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


def clear_shards(out_dir: Path) -> None:
    for path in out_dir.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin"):
        path.unlink()


def clear_dataset(out_dir: Path) -> None:
    for path in [
        *out_dir.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin"),
        out_dir / MANIFEST,
        out_dir / STATE_FILE,
    ]:
        path.unlink(missing_ok=True)


def remove_temp_files(out_dir: Path) -> None:
    """Temp files of a killed run: never valid, as renaming into place is the last step of every write."""
    for path in out_dir.glob(".*.tmp.*"):
        path.unlink(missing_ok=True)
