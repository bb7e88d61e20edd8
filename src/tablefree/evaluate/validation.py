"""The ``validation`` pseudo-task: loss, perplexity and bits per byte on a prepared dataset's ``val`` split.

The split's shards are read as one token stream (documents may cross shard boundaries) and cut into
non-overlapping windows of ``max_seq_len + 1`` tokens (inputs and shifted targets), the last one shorter, so
every token after the stream's first (the end-of-text before the first document) is scored once, with up to
``max_seq_len`` tokens of context. ``limit`` scores the first N windows only; ``coverage`` then says how many
tokens and which documents were left out (and the eval table prints it). Then

* ``val_loss`` = total nats over scored target tokens / number of scored target tokens;
* ``val_ppl`` = exp(val_loss);
* ``bits_per_byte`` = total nats / (ln 2 × total UTF-8 bytes of the target tokens), a token's bytes being those
  its byte-level BPE string stands for (special tokens such as <|endoftext|> count 0 bytes: they are document
  separators, not text). Models with different tokenizers can be compared on it.

The standard error given for ``val_loss`` is that of the mean over the full-length windows (the shorter last one
left out); windows of one text are correlated, so read it as a rough figure. ``per_document`` holds each
validation document's summed nats and scored target tokens (documents in split order; a token belongs to the
document it lies in): the unit the report's cluster bootstrap resamples. ``frequency_bands`` holds the same sums
per document and frequency band of the input and of the target token (``tablefree.evaluate.frequency_bands``;
None for a dataset without a training split, on which the bands are counted). ``coverage.scored_targets`` is the
stream range ``[start, end)`` of the scored target tokens, on which the report's unigram baseline is measured.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tablefree.data.loader import MANIFEST, document_bounds, read_manifest, split_shards, validation_documents
from tablefree.data.shards import open_shard
from tablefree.evaluate.frequency_bands import BandTally, training_bands
from tablefree.evaluate.metrics import mean_stderr


def token_byte_lengths(tokenizer, size: int) -> np.ndarray:
    """UTF-8 bytes each token id stands for, for ids in [0, size); 0 for special tokens and unused ids."""
    spec = json.loads(tokenizer.to_str())
    byte_level = any(_has_byte_level(spec.get(part)) for part in ("pre_tokenizer", "decoder"))
    special = {added["id"] for added in spec.get("added_tokens", []) if added.get("special")}
    added = {added["id"]: added["content"] for added in spec.get("added_tokens", [])}
    lengths = np.zeros(size, dtype=np.int64)
    for token_id in range(min(size, tokenizer.get_vocab_size(with_added_tokens=True))):
        if token_id in special:
            continue
        if token_id in added:
            lengths[token_id] = len(added[token_id].encode("utf-8"))
            continue
        token = tokenizer.id_to_token(token_id)
        if token is None:
            continue
        # byte-level BPE writes each byte as one printable character (GPT-2's bytes_to_unicode)
        lengths[token_id] = len(token) if byte_level else len(tokenizer.decode([token_id]).encode("utf-8"))
    return lengths


def _has_byte_level(component: dict | None) -> bool:
    if not component:
        return False
    if component.get("type") == "ByteLevel":
        return True
    children = component.get("pretokenizers") or component.get("decoders") or []
    return any(_has_byte_level(child) for child in children)


def validation_windows(stream_tokens: int, seq_len: int, limit: int | None = None) -> list[tuple[int, int]]:
    """``(start, targets)`` of each window over a stream of ``stream_tokens``: inputs ``[start, start + targets)``,
    targets one further; full windows of ``seq_len`` targets, the last one shorter; the first ``limit`` only."""
    windows = [
        (start, min(seq_len, stream_tokens - 1 - start)) for start in range(0, stream_tokens - 1, seq_len)
    ]
    return windows if limit is None else windows[:limit]


def check_validation_tokenizer(data_dir: str | Path, tokenizer_hash: str) -> dict:
    """``data_dir``'s manifest, refused unless its tokens come from the checkpoint's tokenizer (checked before
    any scoring work, so a wrong dataset fails at once)."""
    manifest = read_manifest(data_dir)
    if manifest.get("tokenizer_hash") not in (None, tokenizer_hash):
        raise ValueError(
            f"{data_dir}/{MANIFEST}: dataset tokenized with tokenizer {manifest['tokenizer_hash'][:12]}…, "
            f"the checkpoint uses {tokenizer_hash[:12]}…; validation needs the same tokenizer"
        )
    return manifest


@torch.inference_mode()
def validation_metrics(
    model: torch.nn.Module,
    tokenizer,
    data_dir: str,
    tokenizer_hash: str,
    batch_size: int = 32,
    limit: int | None = None,
) -> dict:
    """Result entry of the ``validation`` task over ``data_dir``'s val split (``limit``: at most that many windows)."""
    manifest = check_validation_tokenizer(data_dir, tokenizer_hash)
    seq_len = model.config.max_seq_len
    stream = np.concatenate([open_shard(path) for path in split_shards(data_dir, "val")])  # a small split
    listed = sum(shard["tokens"] for shard in manifest["splits"]["val"]["shards"])
    if len(stream) != listed:
        raise ValueError(
            f"{data_dir}: the val shards hold {len(stream):,} tokens, {MANIFEST} says {listed:,}; the shards "
            "were replaced or the manifest edited: prepare the dataset again"
        )
    windows = validation_windows(len(stream), seq_len, limit)
    byte_lengths = torch.from_numpy(token_byte_lengths(tokenizer, model.config.vocab_size))
    device = next(model.parameters()).device
    window_losses: list[float] = []
    total_nats, total_bytes = 0.0, 0
    documents = DocumentTally(data_dir)
    bands = training_bands(data_dir, model.config.vocab_size)
    band_tally = BandTally(data_dir, bands) if bands is not None else None
    full = [w for w in windows if w[1] == seq_len]
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    batches += [[w] for w in windows if w[1] != seq_len]  # the shorter last window, alone
    for batch in batches:
        length = batch[0][1]
        data = torch.from_numpy(np.stack([stream[s : s + length + 1] for s, _ in batch]).astype(np.int64))
        inputs, targets = data[:, :-1], data[:, 1:]
        logits = model(inputs.to(device))
        nats = F.cross_entropy(
            logits.float().flatten(0, 1), targets.to(device).flatten(), reduction="none"
        ).view(len(batch), -1)
        nats = nats.double().cpu()
        total_nats += float(nats.sum())
        total_bytes += int(byte_lengths[targets].sum())
        if length == seq_len:
            window_losses.extend(nats.mean(dim=1).tolist())
        for (start, _), row, window in zip(batch, nats.numpy(), data.numpy(), strict=True):
            documents.add(start + 1, row)
            if band_tally is not None:
                band_tally.add(start + 1, window[:-1], window[1:], row)
    tokens = sum(n for _, n in windows)
    val_loss = total_nats / tokens
    return {
        "metrics": {
            "val_loss": val_loss,
            "val_ppl": math.exp(val_loss),
            "bits_per_byte": total_nats / (math.log(2) * total_bytes) if total_bytes else float("nan"),
        },
        "stderr": {
            "val_loss": mean_stderr(window_losses) if len(window_losses) > 1 else None,
            "val_ppl": None,
            "bits_per_byte": None,
        },
        "n": len(windows),
        "tokens": tokens,
        "bytes": total_bytes,
        "headline": "bits_per_byte",
        "higher_is_better": {"val_loss": False, "val_ppl": False, "bits_per_byte": False},
        "data_sha256": {shard["file"]: shard.get("sha256") for shard in manifest["splits"]["val"]["shards"]},
        "data_dir": str(data_dir),
        "per_document": documents.as_dict(),
        "frequency_bands": band_tally.as_dict() if band_tally is not None else None,
        "coverage": coverage(data_dir, documents, len(stream), limit),
    }


class DocumentTally:
    """Sums of target nats and counts of target tokens per validation document; a target at stream position p
    belongs to document j when ``bounds[j] <= p < bounds[j + 1]`` (``document_bounds``)."""

    def __init__(self, data_dir: str) -> None:
        self.bounds = document_bounds(data_dir, "val")
        self.starts = self.bounds[:-1]
        self.nats = np.zeros(len(self.starts))
        self.tokens = np.zeros(len(self.starts), dtype=np.int64)

    def add(self, first_target: int, nats: np.ndarray) -> None:
        """``nats``: the losses of the targets at stream positions ``first_target``, ``first_target + 1``, …"""
        positions = first_target + np.arange(len(nats))
        documents = np.searchsorted(self.starts, positions, side="right") - 1
        self.nats += np.bincount(documents, weights=nats, minlength=len(self.starts))
        self.tokens += np.bincount(documents, minlength=len(self.starts))

    def as_dict(self) -> dict:
        return {
            "documents": int((self.tokens > 0).sum()),
            "nats": self.nats.tolist(),
            "tokens": self.tokens.tolist(),
        }


def coverage(data_dir: str, tally: DocumentTally, stream_tokens: int, limit: int | None) -> dict:
    """What the scoring left out of the split: tokens, and which documents were scored only in part or not at
    all (by index in split order and, where ``data prepare`` recorded it, source file and section)."""
    targets = np.diff(tally.bounds)
    targets[0] -= 1  # the stream's first token (the end-of-text before document 0) is context only
    scored = tally.tokens
    partly = np.flatnonzero((scored > 0) & (scored < targets)).tolist()
    unscored = np.flatnonzero((scored == 0) & (targets > 0)).tolist()
    names = document_names(data_dir)
    return {
        "target_tokens": int(targets.sum()),
        "scored_tokens": int(scored.sum()),
        "scored_targets": [1, 1 + int(scored.sum())],
        "documents": len(targets),
        "documents_whole": int(((scored == targets) & (targets > 0)).sum()),
        "partly_scored": [{"index": i, "document": names[i]} for i in partly],
        "not_scored": [{"index": i, "document": names[i]} for i in unscored],
        "left_out_by": None if scored.sum() == targets.sum() else f"limit={limit} windows",
    }


def document_names(data_dir: str) -> list[str]:
    """A short name per validation document: ``file#n`` (and the character range of a held-out section),
    or ``document j`` for datasets without the record."""
    names = []
    for index, item in enumerate(validation_documents(data_dir)):
        if "file" not in item:
            names.append(f"document {index}")
            continue
        name = f"{item['file']}#{item.get('document_in_file', 0)}"
        chars = item.get("planned_chars")
        names.append(f"{name} chars {chars[0]}-{chars[1]}" if chars else name)
    return names


def format_coverage(entry: dict) -> str | None:
    """One line on what a limited validation scoring left out, or None when it scored the whole split."""
    cover = entry.get("coverage")
    if not cover or not cover["left_out_by"]:
        return None
    left = [d["document"] for d in cover["partly_scored"]] + [d["document"] for d in cover["not_scored"]]
    shown = ", ".join(left[:8]) + (f", … ({len(left) - 8} more)" if len(left) > 8 else "")
    return (
        f"validation ({cover['left_out_by']}): scored {cover['scored_tokens']:,} of {cover['target_tokens']:,} "
        f"tokens, {cover['documents_whole']} of {cover['documents']} documents whole; "
        f"{len(cover['partly_scored'])} in part and {len(cover['not_scored'])} not at all: {shown}"
    )
