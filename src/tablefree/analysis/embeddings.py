"""Measures of the effective embeddings E_ℓ (``states.effective_embeddings``): what each layer builds for a
token seen alone, next to a reference model's learned table.

* ``linear_cka`` against the reference's table (its E_0) and against the reference's own E_ℓ;
* ``frequency_r2``: held-out R² of a ridge readout of log token frequency from E_ℓ (k-fold over tokens);
* ``nearest_neighbours`` (cosine) of probe words, and ``knn_overlap``: the share of the k nearest neighbours
  that a layer and the reference table agree on, over the most frequent tokens.
"""

from __future__ import annotations

import torch

from tablefree.analysis.linear import fit_ridge
from tablefree.data.loader import (
    token_counts as token_counts,
)  # its home is data/; named here for old callers

DEFAULT_FREQUENCY_RIDGE = 1e-2
DEFAULT_PROBE_WORDS = (" the", " king", " water", " said", " one", " two", " good", " time", " of", " and")


def frequency_r2(
    embeddings: torch.Tensor, log_counts: torch.Tensor, folds: int = 5, ridge: float = DEFAULT_FREQUENCY_RIDGE
) -> float:
    """Held-out R² of a linear (ridge) readout of ``log_counts`` (n,) from ``embeddings`` (n, d): k-fold over a
    fixed permutation of the tokens, residuals of all folds pooled against each fold's training mean."""
    n = embeddings.shape[0]
    if n < 2 * folds:
        raise ValueError(f"the frequency readout needs at least {2 * folds} tokens, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    y = log_counts.to(torch.float64)
    residual, total = 0.0, 0.0
    for fold in torch.tensor_split(order, folds):
        train = torch.ones(n, dtype=torch.bool)
        train[fold] = False
        model = fit_ridge(embeddings[train], y[train], ridge)
        predicted = model.predict(embeddings[fold]).squeeze(1)
        residual += float((y[fold] - predicted).pow(2).sum())
        total += float((y[fold] - y[train].mean()).pow(2).sum())
    return 1.0 - residual / total if total > 0 else float("nan")


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64)
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def nearest_neighbours(
    embeddings: torch.Tensor, queries: torch.Tensor, candidates: torch.Tensor, k: int
) -> torch.Tensor:
    """For each query id, the k candidate ids with the highest cosine similarity (itself excluded), best first.

    ``embeddings`` (V, d) is indexed by id; ``queries`` and ``candidates`` are id tensors. Ties go to the
    smaller id, so the answer is deterministic."""
    units = _unit_rows(embeddings[candidates])
    out = []
    for batch in torch.split(queries, 512):
        similarity = _unit_rows(embeddings[batch]) @ units.T
        similarity[batch.unsqueeze(1) == candidates.unsqueeze(0)] = -float("inf")
        # stable descending sort: among equal similarities the earlier (smaller) candidate id comes first
        order = torch.sort(similarity, dim=1, descending=True, stable=True).indices[:, :k]
        out.append(candidates[order])
    return torch.cat(out)


def knn_overlap(
    embeddings: torch.Tensor, reference: torch.Tensor, queries: torch.Tensor, candidates: torch.Tensor, k: int
) -> float:
    """Mean share of each query's k nearest neighbours (cosine, among ``candidates``) that ``embeddings`` and
    ``reference`` agree on: 1 = the same neighbourhoods, k/(n−1) ≈ what unrelated spaces share by chance."""
    mine = nearest_neighbours(embeddings, queries, candidates, k)
    theirs = nearest_neighbours(reference, queries, candidates, k)
    shared = (mine.unsqueeze(2) == theirs.unsqueeze(1)).any(2).sum(1)
    return float(shared.double().mean() / k)


def probe_word_ids(
    tokenizer, words: list[str] | tuple[str, ...], usable: torch.Tensor
) -> list[tuple[str, int]]:
    """The probe words that are one (non-special) token of ``tokenizer`` and whose id is ``usable`` (a (V,)
    bool mask), with their ids."""
    chosen = []
    for word in words:
        ids = tokenizer.encode(word, add_special_tokens=False).ids
        # the decode check drops words that came out as an unknown or special token
        one_token = len(ids) == 1 and ids[0] < len(usable) and bool(usable[ids[0]])
        if one_token and tokenizer.decode(ids).strip() == word.strip():
            chosen.append((word, ids[0]))
    return chosen
