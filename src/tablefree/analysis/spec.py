"""``AnalyzeSpec``: what ``run_analysis`` measures and where it writes, parsed once (from ``tablefree analyze``'s
flags, the sweep's ``analysis: true``, or a test) and checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_POSITIONS = 16_384  # positions of held-out text for the bit probes (fit + score)
SPLITS = ("types", "positions")


@dataclass(frozen=True)
class AnalyzeSpec:
    """One analysis of ``checkpoint`` (a checkpoint, run or ``step_*`` parent directory).

    ``reference``: a checkpoint with the same tokenizer (normally the ``learned`` model of the same seed) for
    CKA and neighbours; ``data``: a prepared dataset (default: the one the checkpoint was trained on, from its
    meta.json) whose ``val`` split feeds the probes and whose ``train`` split gives token frequencies;
    ``out``: write analysis.json, analysis.md and figures/ into this directory; ``positions``: held-out
    positions for the probes; ``words``: probe words for the neighbour lists (those that are one token);
    ``embedding_tokens``: limit the effective embeddings to that many of the most frequent tokens (memory is
    (L + 1)·n·d floats per model; None: every token seen in training); ``split``: the probes' fit/score
    split, ``types`` (type-disjoint, the default) or ``positions``; ``mlp_probe``: also fit the MLP probe (one
    hidden ReLU layer, ``MLPProbeSettings()``), which can read XORs of code bits that the linear probe cannot,
    under ``result["mlp_probes"]``; ``verify``: the checkpoint's digests and finite-weights check.
    """

    checkpoint: str | Path
    reference: str | Path | None = None
    data: str | Path | None = None
    out: str | Path | None = None
    tokenizer: str | Path | None = None
    positions: int = DEFAULT_POSITIONS
    words: tuple[str, ...] | list[str] | None = None
    embedding_tokens: int | None = None
    device: str = "cpu"
    batch_size: int = 8
    split: str = "types"
    verify: bool = True
    mlp_probe: bool = False

    def __post_init__(self) -> None:
        positions, embedding_tokens = self.positions, self.embedding_tokens
        if not isinstance(positions, int) or isinstance(positions, bool) or positions < 1:
            raise ValueError(f"positions must be a positive number of token positions, got {positions!r}")
        if embedding_tokens is not None and (isinstance(embedding_tokens, bool) or embedding_tokens < 20):
            raise ValueError(
                f"embedding_tokens must be at least 20 (or None for all), got {embedding_tokens!r}"
            )
        if self.split not in SPLITS:
            raise ValueError(f"split: expected types or positions, got {self.split!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {self.batch_size!r}")
