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
    seeds. Every number is a difference of separate runs' final losses; the intervals are per step, not
    adjusted for the number of steps. Observations of one model size."""
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
    rows, sentences = [], []
    for a, b in pairs:
        for low, high in itertools.pairwise(budgets):
            paired = [s for s in seeds if all(_ran(table, a, b, s, x) for x in (low, high))]
            if not paired:
                continue
            gap = {x: [table[(a, s)][x] - table[(b, s)][x] for s in paired] for x in (low, high)}
            row = _measured_step(a, b, low, high, gap, confidence)
            rows.append(row)
            sentences.append(row["sentence"])
    return {"confidence": confidence, "steps": rows, "sentences": sentences}


def _measured_step(a: str, b: str, low: float, high: float, gap: dict, confidence: float) -> dict:
    """The change of the per-seed gaps from budget ``low`` to ``high``, paired by seed (``stats``' seed t)."""
    n = len(gap[low])
    change = stats.paired_seed_difference(gap[high], gap[low], confidence=confidence)
    gap_low = float(np.mean(gap[low]))
    toward = change.estimate * gap_low < 0  # the change has the opposite sign of the gap: toward 0
    resolved = n >= MIN_SEEDS and change.low is not None and (change.low > EXACT or change.high < -EXACT)
    if not resolved:
        reading = "not resolved" + (f" with {n} seed{'s' if n > 1 else ''}" if n < MIN_SEEDS else "")
    elif not toward:
        reading = "the gap grew"
    else:
        reading = "the gap shrank" if abs(change.estimate) <= abs(gap_low) else "the gap changed sign"
    level = f"{100 * confidence:g}% CI"
    bounds = f"{level} [{num(change.low)}, {num(change.high)}], " if change.low is not None else ""
    sentence = (
        f"From {human(low)} to {human(high)} tokens (separate runs, paired by seed) the measured {a} − {b} gap "
        f"moved from {num(gap_low)} by {change.estimate:+.3g} nats/token ({bounds}{n} seed{'s' if n > 1 else ''}): "
        f"{reading}."
    )
    return {
        "a": a,
        "b": b,
        "from": low,
        "to": high,
        "gap_from": gap_low,
        "change": change.estimate,
        "low": change.low,
        "high": change.high,
        "seeds": n,
        "reading": reading,
        "sentence": sentence,
    }


def _ran(table: dict, a: str, b: str, seed: int, x: float) -> bool:
    return x in table.get((a, seed), {}) and x in table.get((b, seed), {})
