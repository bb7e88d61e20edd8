"""Frequency bands of the vocabulary, and the validation loss summed per document and band.

**The bands.** Token types are ranked by how often they occur in the *training* split of the prepared dataset
(never the validation split), and cut into ``BANDS`` bands of about equal training-token mass: a type falls in
band ⌊BANDS · m / M⌋, m being the training tokens of all strictly more frequent types and M all training tokens
(types of equal count share a band; types never seen in training fall in the rarest). Band 0 is the handful of
types that make up the most frequent fifth of the text, the last band the many rare types that make up its
rarest fifth. Why mass quantiles rather than log-frequency bands: each band then holds about a fifth of the
tokens, so each band's gap is measured with about the same precision, and a band means the same thing (the
rarest fifth of the text) in any vocabulary and corpus size, where fixed log-frequency cut-offs would hold a
few tokens in one vocabulary and most of the text in another.

**The tallies.** Each scored target token is counted twice: in the band of its *input* token (the token the
model was fed at that position: the interface's side) and in the band of its *target* token (the token it had
to predict: the head's side). Per validation document (the unit of the report's cluster bootstrap) and band,
the summed nats and the number of tokens; the bands of one side add up to the document's totals, so the
share-weighted band losses add up exactly to the validation loss (``tablefree.analysis.frequency_bands``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tablefree.data.loader import document_bounds, read_manifest, token_counts

BANDS = 5
SCHEME = "token-mass quantiles of the training split"
SIDES = ("input", "target")


@dataclass(frozen=True)
class FrequencyBands:
    """``band_of`` (V,): each token id's band (0 = most frequent); ``counts`` (V,): its training count."""

    band_of: np.ndarray
    counts: np.ndarray
    bands: int

    def describe(self) -> dict:
        """What defines the bands (the same for every run scored on one dataset): per band its types, its
        share of the training tokens and the range of its types' training frequency (per million tokens)."""
        total = int(self.counts.sum())
        rows = []
        for band in range(self.bands):
            counts = self.counts[self.band_of == band]
            rows.append(
                {
                    "band": band,
                    "types": int(counts.size),
                    "train_share": float(counts.sum() / total) if total else 0.0,
                    "min_per_million": float(counts.min() * 1e6 / total) if counts.size and total else None,
                    "max_per_million": float(counts.max() * 1e6 / total) if counts.size and total else None,
                }
            )
        return {"scheme": SCHEME, "bands": self.bands, "train_tokens": total, "band_table": rows}


def frequency_bands(counts: np.ndarray, bands: int = BANDS) -> FrequencyBands:
    """The bands of token ids with training ``counts`` (V,): ⌊bands · (mass of strictly more frequent types) /
    total⌋, the last band for types never seen."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or counts.size == 0 or (counts < 0).any():
        raise ValueError(
            f"frequency bands need a non-empty vector of non-negative counts, got {counts.shape}"
        )
    if bands < 1:
        raise ValueError(f"frequency bands: expected at least 1 band, got {bands}")
    total = int(counts.sum())
    if total == 0:
        raise ValueError("frequency bands: the training split holds no tokens")
    ascending = np.sort(counts)
    cumulative = np.concatenate([[0], np.cumsum(ascending)])
    more_frequent = total - cumulative[np.searchsorted(ascending, counts, side="right")]
    band_of = np.minimum(bands - 1, (bands * more_frequent) // total)
    band_of[counts == 0] = bands - 1
    return FrequencyBands(band_of.astype(np.int64), counts, bands)


def training_bands(data_dir: str | Path, vocab_size: int, bands: int = BANDS) -> FrequencyBands | None:
    """The bands of ``data_dir``'s training split for ids in [0, vocab_size), or None for a dataset without
    one (a validation-only directory). Counted once per process and dataset: a sweep evaluates many runs on
    one dataset."""
    shards = (read_manifest(data_dir)["splits"].get("train") or {}).get("shards")
    if not shards:
        return None
    key = json.dumps([[s.get("file"), s.get("tokens"), s.get("sha256")] for s in shards])
    return _training_bands(str(Path(data_dir).resolve()), key, vocab_size, bands)


@functools.lru_cache(maxsize=4)
def _training_bands(data_dir: str, shards_key: str, vocab_size: int, bands: int) -> FrequencyBands:
    return frequency_bands(token_counts(data_dir, vocab_size), bands)


class BandTally:
    """Summed nats and token counts per validation document and band, for the input and the target side (a
    target at stream position p belongs to document j when ``bounds[j] <= p < bounds[j + 1]``)."""

    def __init__(self, data_dir: str | Path, bands: FrequencyBands) -> None:
        self.bands = bands
        self.starts = document_bounds(data_dir, "val")[:-1]
        shape = (len(self.starts), bands.bands)
        self.nats = {side: np.zeros(shape) for side in SIDES}
        self.tokens = {side: np.zeros(shape, dtype=np.int64) for side in SIDES}

    def add(self, first_target: int, inputs: np.ndarray, targets: np.ndarray, nats: np.ndarray) -> None:
        """One window: its ``inputs`` and ``targets`` ids and the ``nats`` of the targets at stream positions
        ``first_target``, ``first_target + 1``, …"""
        positions = first_target + np.arange(len(nats))
        documents = np.searchsorted(self.starts, positions, side="right") - 1
        cells = len(self.starts) * self.bands.bands
        for side, ids in (("input", inputs), ("target", targets)):
            index = documents * self.bands.bands + self.bands.band_of[np.asarray(ids)]
            self.nats[side] += np.bincount(index, weights=nats, minlength=cells).reshape(
                self.nats[side].shape
            )
            self.tokens[side] += np.bincount(index, minlength=cells).reshape(self.tokens[side].shape)

    def as_dict(self) -> dict:
        """The bands' definition and, per side, (documents, bands) matrices of nats and tokens."""
        return {
            **self.bands.describe(),
            **{
                side: {"nats": self.nats[side].tolist(), "tokens": self.tokens[side].tolist()}
                for side in SIDES
            },
        }
