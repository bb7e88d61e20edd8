"""Writing a split's token stream as shards, and the journal that lets an interrupted preparation resume.

Every shard is written atomically, and after each one the journal (``.prepare-state.json``) records it with its
sha256 and the resume cursor of its split (the document and the number of that document's tokens already
written). A re-run keeps the journalled shards that are still intact (:func:`valid_prefix`) and continues from
the earliest cursor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tablefree.data.records import JOURNAL_ADVICE, MANIFEST, Journal, parse_record
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
    parse_record(Journal, state, path, JOURNAL_ADVICE)
    check_tokenizer(state["tokenizer_hash"], tok, f"the interrupted preparation in {out_dir} ({path.name})")
    if state["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path}: an interrupted preparation of other inputs or settings is here; use another --out, "
            "or --overwrite"
        )
    return state


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
