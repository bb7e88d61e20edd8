"""The token ratio, no functional form: how many tokens the learned model needs to reach another interface's
loss.

For an interface F other than the learned table (a fixed code, or one with a smaller trainable input such as
``separable``), a budget D and a seed s: the learned run of seed s gives a curve of final
validation loss against its budgets (separate runs, one point per budget); the tokens D* at which that curve
reaches F's final loss at D (seed s) are interpolated linearly in log D between the two budgets around it, and
the ratio is r = D*/D. Below 1 the learned model needs fewer tokens than F: **the table is worth
1/r × data** (F needs 1/r times the tokens for the same loss). Paired by seed, since runs of one
seed share the initialisation and the data order.

Where F's loss lies outside the learned curve's range there is no interpolation and no extrapolation: above
the learned loss at the smallest budget, D* is at most that budget and r a bound "< D_min/D"; below the learned
loss at the largest budget, r is a bound "> D_max/D". Over seeds, the geometric mean of r with a t interval on
log r over the seeds (so r and 1/r have the same interval, inverted); where some seeds give a bound, the mean
is a bound too (the same direction), and with bounds in both directions none is given.

Its change across budgets: per step between consecutive budgets, the change of log r per doubling of D, paired
by seed, with its t interval over the seeds and Holm's correction over the steps of one interface; and over all
budgets where every seed has a value, the least-squares slope of log r against log₂ D per seed, with its t
interval over the seeds. A change reads "rises" or "falls" only where its interval excludes 0 (after Holm for a
step) with 3 or more seeds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from tablefree import stats
from tablefree.scaling.observations import EXACT, MIN_SEEDS, Observation
from tablefree.units import human

REFERENCE = "learned"
DEFINITION = (
    "ratio = D*/D, where D* is the tokens the learned model needs to reach the other interface's final validation "
    "loss at budget D, interpolated linearly in log D on the learned run's own curve of final loss against budget "
    "(the same seed); below 1 the learned model needs fewer tokens: the table is worth 1/ratio × data"
)
INTERVAL = "t interval over seeds on log ratio (geometric mean over seeds)"


def token_ratio(
    observations: Sequence[Observation],
    reference: str = REFERENCE,
    confidence: float = 0.95,
    past_plateau: Sequence[float] | None = None,
) -> dict:
    """Per interface compared with ``reference`` (every other one) and budget, the token ratio with its interval
    over seeds or its bound, and its change across budgets (module docstring). Observations of one model size.
    ``past_plateau``: the budgets of the fit window, marked on each row (None: not known)."""
    table: dict[tuple[str, int], dict[float, float]] = {}
    for o in observations:
        table.setdefault((o.interface, o.seed), {})[o.tokens] = o.loss
    interfaces = list(dict.fromkeys(o.interface for o in observations))
    level = f"{100 * confidence:g}%"
    result: dict = {
        "reference": reference,
        "definition": DEFINITION,
        "interval": f"{level} {INTERVAL}",
        "step_interval": f"{level} t interval over seeds, Holm over the steps of each interface",
        "confidence": confidence,
        "codes": [],
        "sentences": [],
    }
    if reference not in interfaces:
        result["refused"] = f"no {reference} runs to measure the ratio against"
        return result
    result["refused"] = None
    budgets = sorted({o.tokens for o in observations})
    for code in (i for i in interfaces if i != reference):
        seeds = sorted(s for (i, s) in table if i == code and len(table.get((reference, s), {})) >= 2)
        rows = []
        values: dict[float, dict[int, tuple[str, float]]] = {}
        for budget in budgets:
            here = {
                s: _needed(table[(reference, s)], table[(code, s)][budget], budget)
                for s in seeds
                if budget in table[(code, s)]
            }
            if not here:
                continue
            values[budget] = here
            row = {"tokens": budget, **_over_seeds(list(here.values()), confidence)}
            if past_plateau is not None:
                row["past_plateau"] = budget in set(past_plateau)
            rows.append(row)
        steps = _steps(values, confidence)
        entry = {"code": code, "budgets": rows, "steps": steps, "trend": _trend(values, confidence)}
        entry["sentences"] = _sentences(code, reference, entry, level)
        result["codes"].append(entry)
        result["sentences"] += entry["sentences"]
    return result


def _needed(curve: dict[float, float], target: float, budget: float) -> tuple[str, float]:
    """(kind, ratio): "exact" where the learned curve crosses ``target`` inside its budgets (linear in log D),
    "below" (the ratio is below the value) where the learned loss at its smallest budget is already at or below
    ``target``, "above" where the learned curve never gets down to it."""
    xs = sorted(curve)
    ys = [curve[x] for x in xs]
    first = next((i for i, y in enumerate(ys) if y <= target), None)
    if first is None:
        return "above", xs[-1] / budget
    if first == 0:  # reached at the smallest budget: exactly there, or somewhere below it
        return ("exact" if ys[0] >= target - EXACT else "below"), xs[0] / budget
    low, high = ys[first - 1], ys[first]
    share = (low - target) / (low - high)
    log_d = math.log(xs[first - 1]) + share * (math.log(xs[first]) - math.log(xs[first - 1]))
    return "exact", math.exp(log_d) / budget


def _over_seeds(values: list[tuple[str, float]], confidence: float) -> dict:
    kinds = {kind for kind, _ in values}
    logs = [math.log(r) for _, r in values]
    mean = math.exp(float(np.mean(logs)))
    out = {"seeds": len(values), "per_seed": [{"kind": k, "ratio": r} for k, r in values]}
    if kinds == {"exact"}:
        low = high = None
        if len(values) > 1:
            d = stats.paired_seed_difference(logs, [0.0] * len(logs), confidence=confidence)
            low, high = math.exp(d.low), math.exp(d.high)
        return {
            **out,
            "bound": None,
            "estimate": mean,
            "low": low,
            "high": high,
            "worth": 1 / mean,
            "worth_low": None if high is None else 1 / high,
            "worth_high": None if low is None else 1 / low,
        }
    empty = {
        "estimate": None,
        "low": None,
        "high": None,
        "worth": None,
        "worth_low": None,
        "worth_high": None,
    }
    if "below" in kinds and "above" in kinds:
        return {**out, **empty, "bound": None, "bound_value": None}
    # the bounds plugged in bound the geometric mean in their direction
    return {**out, **empty, "bound": "<" if "below" in kinds else ">", "bound_value": mean}


def _steps(values: dict[float, dict[int, tuple[str, float]]], confidence: float) -> list[dict]:
    budgets = sorted(values)
    rows = []
    for low, high in itertools.pairwise(budgets):
        seeds = [
            s for s in values[low] if s in values[high] and values[low][s][0] == values[high][s][0] == "exact"
        ]
        doublings = math.log2(high / low)
        changes = [(math.log(values[high][s][1]) - math.log(values[low][s][1])) / doublings for s in seeds]
        row = {"from": low, "to": high, "seeds": len(seeds)}
        if len(seeds) < 2:
            rows.append({**row, "change": None, "low": None, "high": None, "p_value": None, "factor": None})
            continue
        d = stats.paired_seed_difference(changes, [0.0] * len(changes), confidence=confidence)
        rows.append(
            {
                **row,
                "change": d.estimate,
                "low": d.low,
                "high": d.high,
                "p_value": d.p_value,
                "factor": math.exp(d.estimate),
            }
        )
    adjusted = stats.holm([r["p_value"] for r in rows])
    for row, p in zip(rows, adjusted, strict=True):
        row["adjusted_p"] = p
        resolved = p is not None and p < 1 - confidence and (row["low"] > EXACT or row["high"] < -EXACT)
        row["reading"] = _reading(row["change"], resolved, row["seeds"])
    return rows


def _trend(values: dict[float, dict[int, tuple[str, float]]], confidence: float) -> dict | None:
    """The slope of log r against log₂ D per seed over the budgets where every seed (of the interface's seeds
    at every such budget) has an interpolated ratio; None with fewer than 3 such budgets or 2 seeds."""
    seeds = sorted(set.intersection(*(set(v) for v in values.values()))) if values else []
    budgets = [b for b in sorted(values) if all(values[b][s][0] == "exact" for s in seeds)]
    if len(budgets) < 3 or len(seeds) < 2:
        return None
    logs = np.array([[math.log(values[b][s][1]) for b in budgets] for s in seeds])
    fit = stats.slope_against_log(budgets, logs, confidence=confidence)
    per_doubling = {k: fit[k] * math.log(2) for k in ("slope", "low", "high")}
    resolved = per_doubling["low"] > EXACT or per_doubling["high"] < -EXACT  # beyond rounding
    return {
        "from": budgets[0],
        "to": budgets[-1],
        "budgets": len(budgets),
        "seeds": len(seeds),
        "change_per_doubling": per_doubling["slope"],
        "low": per_doubling["low"],
        "high": per_doubling["high"],
        "factor": math.exp(per_doubling["slope"]),
        "reading": _reading(per_doubling["slope"], resolved, len(seeds)),
    }


def _reading(change: float | None, resolved: bool, seeds: int) -> str:
    if change is None:
        return "no interval"
    if seeds < MIN_SEEDS or not resolved:
        return "not resolved" + (f" with {seeds} seeds" if seeds < MIN_SEEDS else "")
    return "rises" if change > 0 else "falls"


def _sentences(code: str, reference: str, entry: dict, level: str) -> list[str]:
    sentences = []
    for row in entry["budgets"]:
        at = f"At {human(row['tokens'])} tokens"
        if row["estimate"] is not None:
            interval = (
                f" ({level} t over {row['seeds']} seeds: [{stats.fmt(row['low'])}, {stats.fmt(row['high'])}])"
                if row["low"] is not None
                else f" ({row['seeds']} seed)"
            )
            sentences.append(
                f"{at} {reference} reaches {code}'s loss with {stats.fmt(row['estimate'])}× the tokens{interval}: "
                f"the table is worth ×{stats.fmt(row['worth'])} data."
            )
        elif row["bound"] is not None:
            sentences.append(
                f"{at} the ratio of {reference} to {code} is {row['bound']} {stats.fmt(row['bound_value'])}: "
                f"{code}'s loss lies {'above' if row['bound'] == '<' else 'below'} {reference}'s curve over the "
                "budgets run (a bound, not extrapolated)."
            )
        else:
            sentences.append(f"{at} {code}'s loss lies outside {reference}'s curve on both sides: no ratio.")
    trend = entry["trend"]
    if trend is not None:
        sentences.append(
            f"From {human(trend['from'])} to {human(trend['to'])} tokens the ratio of {reference} to {code} changes "
            f"by ×{stats.fmt(trend['factor'])} per doubling ({level} t over {trend['seeds']} seeds on log ratio: "
            f"[×{stats.fmt(math.exp(trend['low']))}, ×{stats.fmt(math.exp(trend['high']))}]): {trend['reading']}."
        )
    return sentences
