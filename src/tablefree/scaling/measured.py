"""What the separate runs measured, no fit: how each pair's gap moved between consecutive budgets."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from tablefree import stats
from tablefree.scaling.observations import EXACT, MIN_SEEDS, Observation
from tablefree.scaling.sentences import num
from tablefree.units import human


def measured_changes(
    observations: Sequence[Observation],
    pairs: Sequence[tuple[str, str]] | None = None,
    confidence: float = 0.95,
) -> dict:
    """No fit: for each pair (A, B) and each step between consecutive budgets, how the measured gap A − B moved,
    paired by seed (the seeds with a run of both interfaces at both budgets), with its t interval over those
    seeds. Every number is a difference of separate runs' final losses. The steps of all pairs form one family:
    each step's p-value (of its seed t) is Holm-adjusted over them, and a step reads "grew", "shrank" or
    "changed sign" only when its adjusted p-value is below 1 − ``confidence`` with 3 or more seeds; "changed
    sign" also needs the new gap's own t interval to exclude 0 (else the gap shrank to within noise of 0). The
    per-step interval is printed unadjusted, and the reading is Holm's. Observations of one model size."""
    table: dict[tuple[str, int], dict[float, float]] = {}
    for o in observations:
        per_budget = table.setdefault((o.interface, o.seed), {})
        if o.tokens in per_budget:
            raise ValueError(
                f"{o.interface} seed {o.seed}: two runs at {human(o.tokens)} tokens (one model size at a time)"
            )
        per_budget[o.tokens] = o.loss
    names = list(dict.fromkeys(o.interface for o in observations))
    pairs = list(itertools.combinations(names, 2)) if pairs is None else [tuple(p) for p in pairs]
    for a, b in pairs:
        for name in (a, b):
            if name not in names:
                raise ValueError(f"pair ({a}, {b}): no observations of {name!r} (have {', '.join(names)})")
    budgets = sorted({o.tokens for o in observations})
    seeds = sorted({o.seed for o in observations})
    rows = []
    for a, b in pairs:
        for low, high in itertools.pairwise(budgets):
            paired = [s for s in seeds if all(_ran(table, a, b, s, x) for x in (low, high))]
            if not paired:
                continue
            gap = {x: [table[(a, s)][x] - table[(b, s)][x] for s in paired] for x in (low, high)}
            rows.append(_measured_step(a, b, low, high, gap, confidence))
    for row, adjusted in zip(rows, stats.holm([r["p_value"] for r in rows]), strict=True):
        row["adjusted_p"] = adjusted
        row["family"] = len(rows)
        row["reading"] = _reading(row, adjusted, 1 - confidence)
        row["sentence"] = _step_sentence(row, confidence)
    return {
        "confidence": confidence,
        "interval": f"{100 * confidence:g}% t interval over seeds, per step",
        "correction": f"Holm over the {len(rows)} steps of this table, every pair and step",
        "steps": rows,
        "sentences": [row["sentence"] for row in rows],
    }


def _measured_step(a: str, b: str, low: float, high: float, gap: dict, confidence: float) -> dict:
    """The change of the per-seed gaps from budget ``low`` to ``high``, paired by seed (``stats``' seed t), and
    the gap at ``high`` with its own seed t interval."""
    n = len(gap[low])
    change = stats.paired_seed_difference(gap[high], gap[low], confidence=confidence)
    after = stats.paired_seed_difference(gap[high], [0.0] * n, confidence=confidence)
    return {
        "a": a,
        "b": b,
        "from": low,
        "to": high,
        "gap_from": float(np.mean(gap[low])),
        "gap_to": after.estimate,
        "gap_to_low": after.low,
        "gap_to_high": after.high,
        "change": change.estimate,
        "low": change.low,
        "high": change.high,
        "p_value": None if change.low is None else change.p_value,
        "seeds": n,
    }


def _reading(row: dict, adjusted: float | None, alpha: float) -> str:
    n = row["seeds"]
    resolved = (
        n >= MIN_SEEDS
        and adjusted is not None
        and adjusted < alpha
        and (row["low"] > EXACT or row["high"] < -EXACT)
    )
    if not resolved:
        return "not resolved" + (f" with {n} seed{'s' if n > 1 else ''}" if n < MIN_SEEDS else "")
    if row["change"] * row["gap_from"] >= 0:  # the change has the sign of the gap: away from 0
        return "the gap grew"
    if abs(row["change"]) <= abs(row["gap_from"]):
        return "the gap shrank"
    flipped = row["gap_to_low"] is not None and (row["gap_to_low"] > 0 or row["gap_to_high"] < 0)
    return (
        "the gap changed sign"
        if flipped
        else "the gap shrank to within noise of 0 (its new sign not resolved)"
    )


def _step_sentence(row: dict, confidence: float) -> str:
    n = row["seeds"]
    level = f"{100 * confidence:g}% t interval over seeds"
    bounds = f"{level} [{num(row['low'])}, {num(row['high'])}], " if row["low"] is not None else ""
    holm = (
        f"Holm-adjusted p {stats.fmt_p(row['adjusted_p'])} of {row['family']}, "
        if row["adjusted_p"] is not None
        else ""
    )
    return (
        f"From {human(row['from'])} to {human(row['to'])} tokens (separate runs, paired by seed) the measured "
        f"{row['a']} − {row['b']} gap moved from {num(row['gap_from'])} by {row['change']:+.3g} nats/token "
        f"({bounds}{holm}{n} seed{'s' if n > 1 else ''}): {row['reading']}."
    )


def _ran(table: dict, a: str, b: str, seed: int, x: float) -> bool:
    return x in table.get((a, seed), {}) and x in table.get((b, seed), {})
