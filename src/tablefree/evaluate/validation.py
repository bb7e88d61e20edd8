"""The ``validation`` pseudo-task: loss, perplexity and bits per byte on a prepared dataset's ``val`` split.

The split is read as the training loader reads it in sequential mode: non-overlapping windows of
``max_seq_len + 1`` tokens (inputs and shifted targets), never crossing a shard boundary, so every target token
is scored once with up to ``max_seq_len`` tokens of context. Then

* ``val_loss`` = total nats over target tokens / number of target tokens;
* ``val_ppl`` = exp(val_loss);
* ``bits_per_byte`` = total nats / (ln 2 × total UTF-8 bytes of the target tokens), a token's bytes being those
  its byte-level BPE string stands for (special tokens such as <|endoftext|> count 0 bytes: they are document
  separators, not text). Models with different tokenizers can be compared on it.

The standard error given for ``val_loss`` is that of the mean over windows (equal-length windows, so their mean
is ``val_loss``); windows of one text are correlated, so read it as a rough figure. ``per_document`` holds each
validation document's summed nats and scored target tokens (documents in split order; a token belongs to the
document it lies in): the unit the report's cluster bootstrap resamples.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import torch.nn.functional as F

from tablefree.data.loader import MANIFEST, TokenLoader, document_bounds, read_manifest
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
    manifest = read_manifest(data_dir)
    if manifest.get("tokenizer_hash") not in (None, tokenizer_hash):
        raise ValueError(
            f"{data_dir}/{MANIFEST}: dataset tokenized with tokenizer {manifest['tokenizer_hash'][:12]}…, "
            f"the checkpoint uses {tokenizer_hash[:12]}…; validation needs the same tokenizer"
        )
    seq_len = model.config.max_seq_len
    loader = TokenLoader.from_dir(data_dir, "val", seq_len=seq_len, batch_size=batch_size, shuffle=False)
    windows = loader.num_chunks if limit is None else min(limit, loader.num_chunks)
    byte_lengths = torch.from_numpy(token_byte_lengths(tokenizer, model.config.vocab_size))
    device = next(model.parameters()).device
    window_losses: list[float] = []
    total_nats, total_bytes = 0.0, 0
    documents = DocumentTally(data_dir, seq_len)
    for step in range(math.ceil(windows / batch_size)):
        inputs, targets = loader.batch(step)
        keep = min(batch_size, windows - step * batch_size)  # the last batch wraps around: drop the repeats
        inputs, targets = inputs[:keep], targets[:keep]
        logits = model(inputs.to(device))
        nats = F.cross_entropy(
            logits.float().flatten(0, 1), targets.to(device).flatten(), reduction="none"
        ).view(keep, -1)
        nats = nats.double().cpu()
        total_nats += float(nats.sum())
        total_bytes += int(byte_lengths[targets].sum())
        window_losses.extend(nats.mean(dim=1).tolist())
        documents.add(step * batch_size, nats.numpy())
    tokens = windows * seq_len
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
        "n": windows,
        "tokens": tokens,
        "bytes": total_bytes,
        "headline": "bits_per_byte",
        "higher_is_better": {"val_loss": False, "val_ppl": False, "bits_per_byte": False},
        "data_sha256": {shard["file"]: shard.get("sha256") for shard in manifest["splits"]["val"]["shards"]},
        "data_dir": str(data_dir),
        "per_document": documents.as_dict(),
    }


class DocumentTally:
    """Sums of target nats and counts of target tokens per validation document, window by window (windows are
    the sequential ``TokenLoader`` chunks: ``(len(shard) - 1) // seq_len`` per shard, in shard order)."""

    def __init__(self, data_dir: str, seq_len: int) -> None:
        self.starts = document_bounds(data_dir, "val")[:-1]
        self.seq_len = seq_len
        offsets, chunk_offsets = [], []
        offset = 0
        for shard in read_manifest(data_dir)["splits"]["val"]["shards"]:
            chunk_offsets.append(max(0, (shard["tokens"] - 1) // seq_len))
            offsets.append(offset)
            offset += shard["tokens"]
        self.shard_offsets = np.array(offsets, dtype=np.int64)
        self.chunk_starts = np.concatenate(([0], np.cumsum(chunk_offsets))).astype(np.int64)
        self.nats = np.zeros(len(self.starts))
        self.tokens = np.zeros(len(self.starts), dtype=np.int64)

    def add(self, first_window: int, nats: np.ndarray) -> None:
        """``nats`` (windows, seq_len): the target losses of windows ``first_window``, ``first_window + 1``, …"""
        chunks = np.arange(first_window, first_window + nats.shape[0])
        shards = np.searchsorted(self.chunk_starts, chunks, side="right") - 1
        first_target = self.shard_offsets[shards] + (chunks - self.chunk_starts[shards]) * self.seq_len + 1
        positions = first_target[:, None] + np.arange(self.seq_len)
        documents = np.searchsorted(self.starts, positions.ravel(), side="right") - 1
        self.nats += np.bincount(documents, weights=nats.ravel(), minlength=len(self.starts))
        self.tokens += np.bincount(documents, minlength=len(self.starts))

    def as_dict(self) -> dict:
        return {
            "documents": int((self.tokens > 0).sum()),
            "nats": self.nats.tolist(),
            "tokens": self.tokens.tolist(),
        }
