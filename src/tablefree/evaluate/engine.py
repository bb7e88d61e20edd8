"""The scoring engine: log-likelihoods of continuations given contexts, as lm-evaluation-harness computes them.

``loglikelihoods(model, requests, batch_size)`` takes ``(context_tokens, continuation_tokens)`` pairs and returns,
per pair, the summed log-probability of the continuation and whether greedy decoding reproduces it. It matches
lm-eval 0.4's ``HFLM._loglikelihood_tokens`` for a causal model: each request's input is
``(context + continuation)[-(max_len + 1):][:-1]`` (left truncation to the model's context length) and the
continuation's log-probs are read from the last ``len(continuation)`` positions.

It is faster than one forward pass per request because requests that share a (truncated) context are packed
into ONE row: the context once, then each continuation's tokens, with a tree attention mask (a continuation sees
the context and its own earlier tokens, never another continuation) and per-token positions (every continuation
starts at position ``len(context)``). So a HellaSwag example costs one row of ``context + 4 endings`` tokens
instead of four rows of ``context + ending``. Rows are sorted by length (longest first, as lm-eval does) and
batched with right padding, a batch ending early where padding would pass 10% of it. Only the positions whose
log-probs are read get the last block's queries, attention output and MLP and the output head
(``model.hidden(..., outputs=...)`` then ``model.head``): on LAMBADA that is 1-3 positions of about 100. The
arithmetic is that of a plain forward pass over each full string, so results do not depend on batch size or order
beyond float rounding (tests check both against an independent forward pass).

``encode_pair`` does the text side exactly as lm-eval's ``TemplateLM._encode_pair`` / ``loglikelihood``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

Request = tuple[Sequence[int], Sequence[int]]


# ------------------------------------------------------------------------------------------------------------
# Text -> tokens (lm-eval semantics)


def encode_pair(
    tokenizer, context: str, continuation: str, prefix_token_id: int
) -> tuple[list[int], list[int]]:
    """Token ids of (context, continuation) as lm-eval's causal ``loglikelihood`` makes them.

    Trailing whitespace of the context moves onto the continuation; context and continuation are encoded
    together and the whole is split at the length of the context encoded alone. An empty context becomes
    ``[prefix_token_id]`` (lm-eval uses the EOT/BOS token), unless the continuation already starts with it.
    ``tokenizer`` is a ``tokenizers.Tokenizer``; ``encode`` applies its post-processor as HF's default
    ``add_special_tokens=True`` does (our byte-level BPE adds no BOS).
    """
    return encode_pairs(tokenizer, [(context, continuation)], prefix_token_id)[0]


def encode_pairs(
    tokenizer, pairs: Sequence[tuple[str, str]], prefix_token_id: int
) -> list[tuple[list[int], list[int]]]:
    """``encode_pair`` over many pairs, with the tokenizer's batch encoder."""
    split_pairs, texts = [], []
    for context, continuation in pairs:
        if context == "":
            split_pairs.append(None)
            texts.append(continuation)
            continue
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        split_pairs.append(context)
        texts.append(context + continuation)
    contexts = sorted({c for c in split_pairs if c is not None})
    context_ids = dict(zip(contexts, _encode_batch(tokenizer, contexts), strict=True))
    out = []
    for context, whole in zip(split_pairs, _encode_batch(tokenizer, texts), strict=True):
        if context is None:  # empty context: condition on the prefix token (lm-eval's prefix_token_id)
            if whole and whole[0] == prefix_token_id:
                out.append((whole[:1], whole[1:]))
            else:
                out.append(([prefix_token_id], whole))
            continue
        context_enc = context_ids[context]
        out.append((context_enc, whole[len(context_enc) :]))
    return out


def _encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)] if texts else []


# ------------------------------------------------------------------------------------------------------------
# Packing


@dataclass
class _Row:
    """One packed row: a context followed by the continuations that share it."""

    context: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)  # 0: context, j: the j-th continuation in this row
    # per continuation: (request key index, prediction positions in the row, target tokens)
    scored: list[tuple[int, list[int], tuple[int, ...]]] = field(default_factory=list)

    @classmethod
    def start(cls, context: tuple[int, ...]) -> _Row:
        n = len(context)
        return cls(context, list(context), list(range(n)), [0] * n)

    def add(self, key_index: int, continuation: tuple[int, ...]) -> None:
        c = len(self.context)
        segment = len(self.scored) + 1
        first = len(self.tokens)
        fed = continuation[:-1]  # the last continuation token is predicted, never fed
        self.tokens.extend(fed)
        self.positions.extend(range(c, c + len(fed)))
        self.segments.extend([segment] * len(fed))
        # token 0 is predicted from the context's last position, token k from the row slot of token k-1
        predictors = [c - 1, *range(first, first + len(fed))]
        self.scored.append((key_index, predictors, continuation))


def _pack(keys: list[tuple[tuple[int, ...], tuple[int, ...]]], max_len: int) -> list[_Row]:
    """Rows of at most ``max_len`` tokens (or one context + one continuation), one context per row."""
    by_context: dict[tuple[int, ...], list[int]] = {}
    for index, (context, _) in enumerate(keys):
        by_context.setdefault(context, []).append(index)
    rows = []
    for context, indices in by_context.items():
        row = _Row.start(context)
        for index in indices:
            continuation = keys[index][1]
            if row.scored and len(row.tokens) + len(continuation) - 1 > max_len:
                rows.append(row)
                row = _Row.start(context)
            row.add(index, continuation)
        rows.append(row)
    return rows


def truncate(context: Sequence[int], continuation: Sequence[int], max_len: int) -> tuple[int, ...]:
    """The context lm-eval actually feeds: ``(context + continuation)[-(max_len + 1):]`` minus the continuation."""
    if len(context) == 0:
        raise ValueError("loglikelihood request with an empty context (encode_pair gives it a prefix token)")
    if len(continuation) == 0:
        raise ValueError("loglikelihood request with an empty continuation")
    if len(continuation) > max_len:
        raise ValueError(f"continuation of {len(continuation)} tokens exceeds the model's context {max_len}")
    whole = [*context, *continuation][-(max_len + 1) :]
    return tuple(int(t) for t in whole[: len(whole) - len(continuation)])


# ------------------------------------------------------------------------------------------------------------
# Scoring


@torch.inference_mode()
def loglikelihoods(
    model: torch.nn.Module,
    requests: Sequence[Request],
    batch_size: int = 32,
    *,
    max_len: int | None = None,
    progress: bool = False,
    dtype: torch.dtype | None = None,
) -> list[tuple[float, bool]]:
    """(summed log-prob of the continuation, greedy match) for each (context_ids, continuation_ids) request.

    ``batch_size`` counts packed rows (one shared context with its continuations each; a batch can hold fewer
    where padding would cost over 10% of its positions: ``_batches``). ``max_len`` defaults
    to ``model.config.max_seq_len``; inputs are left-truncated to it as lm-eval does. ``dtype=torch.bfloat16``
    runs the forward pass under bf16 autocast (log-softmax and sums stay fp32/fp64); None keeps the model's.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    max_len = int(max_len or model.config.max_seq_len)
    keys = [(truncate(ctx, cont, max_len), tuple(int(t) for t in cont)) for ctx, cont in requests]
    unique = list(dict.fromkeys(keys))  # identical requests are scored once
    rows = _pack(unique, max_len)
    rows.sort(key=lambda row: (-len(row.tokens), row.tokens))
    device = next(model.parameters()).device
    sums = torch.zeros(len(unique), dtype=torch.float64)
    greedy = torch.ones(len(unique), dtype=torch.bool)
    batches = _batches(rows, batch_size)
    autocast = (
        torch.autocast(device.type, dtype=dtype)
        if dtype is not None and dtype != torch.float32
        else contextlib.nullcontext()
    )
    for batch in tqdm(batches, desc="scoring", unit="batch", disable=not progress):
        with autocast:
            _score_batch(model, batch, device, sums, greedy)
    result = {key: (float(sums[i]), bool(greedy[i])) for i, key in enumerate(unique)}
    return [result[key] for key in keys]


def _batches(rows: list[_Row], batch_size: int, max_padding: float = 0.1) -> list[list[_Row]]:
    """Consecutive rows (sorted longest first) in batches of at most ``batch_size`` rows; a batch also ends
    before padding would exceed ``max_padding`` of its tokens, so a few long rows are not batched with many
    short ones (with a fixed row count, 8-40% of the positions on HellaSwag, PIQA and LAMBADA were padding)."""
    batches: list[list[_Row]] = []
    batch: list[_Row] = []
    real = 0
    for row in rows:
        n = len(row.tokens)
        if batch:
            padded = (len(batch) + 1) * len(batch[0].tokens)
            if len(batch) == batch_size or padded - (real + n) > max_padding * padded:
                batches.append(batch)
                batch, real = [], 0
        batch.append(row)
        real += n
    return [*batches, batch] if batch else batches


def _score_batch(
    model: torch.nn.Module, rows: list[_Row], device: torch.device, sums: torch.Tensor, greedy: torch.Tensor
) -> None:
    width = max(len(row.tokens) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    segments = torch.full((len(rows), width), -1, dtype=torch.long)  # -1: padding
    # each row's distinct predicting positions (a context's last position predicts every continuation's first
    # token); a row with fewer repeats position 0, whose state is computed and never read
    slots = [sorted({p for _, predictors, _ in row.scored for p in predictors}) for row in rows]
    outputs = torch.zeros(len(rows), max(map(len, slots)), dtype=torch.long)
    row_index, slot, target, owner = [], [], [], []
    for b, (row, row_slots) in enumerate(zip(rows, slots, strict=True)):
        n = len(row.tokens)
        ids[b, :n] = torch.tensor(row.tokens)
        positions[b, :n] = torch.tensor(row.positions)
        segments[b, :n] = torch.tensor(row.segments)
        outputs[b, : len(row_slots)] = torch.tensor(row_slots)
        slot_of = {p: i for i, p in enumerate(row_slots)}
        for key_index, predictors, continuation in row.scored:
            row_index.extend([b] * len(predictors))
            slot.extend(slot_of[p] for p in predictors)
            target.extend(continuation)
            owner.extend([key_index] * len(predictors))
    mask = tree_mask(segments).to(device)
    ids, positions = ids.to(device), positions.to(device)
    picked = (torch.tensor(row_index, device=device), torch.tensor(slot, device=device))
    # the last block and the head run only where log-probs are read
    states = model.hidden(ids, positions=positions, mask=mask, outputs=outputs.to(device))[picked]
    target_t = torch.tensor(target, device=device)
    token_logprob, token_greedy = [], []
    # in chunks of about 4M logits, which bounds their memory (a batch of HellaSwag rows at V = 49,152 would
    # otherwise hold over 250 MB of fp32 log-probs); the results are the same row by row
    chunk = max(1, _LOGITS_PER_CHUNK // model.config.vocab_size)
    for start in range(0, len(target), chunk):
        logprobs = F.log_softmax(model.head(states[start : start + chunk]).float(), dim=-1)
        targets = target_t[start : start + chunk]
        chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
        token_logprob.append(chosen)
        token_greedy.append(_is_argmax(logprobs, targets, chosen))
    owner_t = torch.tensor(owner)
    sums.index_add_(0, owner_t, torch.cat(token_logprob).double().cpu())
    # a request is a greedy match when none of its tokens is a miss
    greedy.index_put_((owner_t[~torch.cat(token_greedy).cpu()],), torch.tensor(False))


_LOGITS_PER_CHUNK = 1 << 22


def _is_argmax(logprobs: torch.Tensor, targets: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``logprobs.argmax(-1) == targets`` (lm-eval's greedy check: the first maximum counts). On the CPU it is
    computed with ``amax``, about 10x cheaper than ``argmax`` there; argmax runs only on the rows where the
    target reaches the maximum (to settle ties by index) or the maximum is NaN (which argmax picks). On an
    accelerator argmax is cheap and ``nonzero`` would wait for the device. ``chosen``: the targets' log-probs."""
    if logprobs.device.type != "cpu":
        return logprobs.argmax(dim=-1) == targets
    largest = logprobs.amax(dim=-1)
    hits = chosen == largest
    rows = (hits | largest.isnan()).nonzero().squeeze(1)
    hits[rows] = logprobs[rows].argmax(dim=-1) == targets[rows]
    return hits


def tree_mask(segments: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask (B, 1, T, T) for packed rows; True = may attend.

    A query attends causally to the context (segment 0) and to its own segment. Padding (segment -1) attends to
    earlier padding and the context, so its rows stay finite, and no real token ever attends to padding.
    """
    T = segments.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)
    allowed = causal & ((key == 0) | (key == query))
    return allowed.unsqueeze(1)
