"""The observations a scaling fit rests on, and the design: which budgets and seeds a fit uses, or why it is refused.

**The data.** One observation is the final validation loss of one *separate run*: an (interface, seed) pair
trained to one budget of D tokens (its own schedule, or a decay branched from a shared stable phase), with its
trainable parameter count N where known. Points along one run (the in-training estimates at 1M, 2M, … of an
8M-token run) are not separate budgets: they share one learning-rate schedule, so their losses measure the
anneal, not the budget, and their errors are correlated. ``observations_from_dicts`` refuses a second loss for
the same (interface, seed, tokens, params).

**Refusals.** A fit needs at least 5 budgets spanning at least 16× (less 1% for budgets rounded to whole steps), and at least 3 seeds that have a run at
every budget for every interface (the paired design); short data raise a ValueError that says what is short.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tablefree import stats
from tablefree.units import human

MIN_BUDGETS = 5
MIN_SPAN = 16.0
# Budgets are trained in whole optimizer steps, so a grid declared 16× apart realises a little less (525k and 8.4M
# at 4,096 tokens a step: 129 and 2,051 steps, 15.9×); a span this close (relative) below the minimum counts.
SPAN_ROUNDING = 0.01
MIN_SEEDS = 3
EXACT = 1e-9  # nats/token: a fit's miss or a backtest's error this small is rounding (noiseless points)
RATIO_TOLERANCE = 0.05  # tokens-per-parameter ratios this close (relative) are one ratio of a size fit


@dataclass(frozen=True)
class Observation:
    """The final validation loss of one separate run (nats/token)."""

    interface: str
    seed: int
    tokens: float
    loss: float
    params: float | None = None


def observations_from_dicts(rows: Iterable[Mapping]) -> list[Observation]:
    """Observations from dicts with keys interface, seed, tokens, loss and optionally params. Bad input raises
    a ValueError naming the row and field; a second loss for one run (same interface, seed, tokens, params) is
    refused: points along one run are not separate budgets."""
    observations: list[Observation] = []
    seen: dict[tuple, int] = {}
    for index, row in enumerate(rows):
        where = f"observation {index}"
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: expected a mapping with interface, seed, tokens, loss, got {row!r}")
        missing = [key for key in ("interface", "seed", "tokens", "loss") if key not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(row) - {"interface", "seed", "tokens", "loss", "params"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
        interface = row["interface"]
        if not isinstance(interface, str) or not interface:
            raise ValueError(f"{where}: field 'interface' must be a non-empty string, got {interface!r}")
        seed = row["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{where}: field 'seed' must be an integer, got {seed!r}")
        tokens = _positive(row["tokens"], where, "tokens")
        loss = _positive(row["loss"], where, "loss")
        params = None if row.get("params") is None else _positive(row["params"], where, "params")
        key = (interface, seed, tokens, params)
        if key in seen:
            raise ValueError(
                f"{where}: a second loss for {interface} seed {seed} at {human(tokens)} tokens (first in "
                f"observation {seen[key]}); give one final loss per separate run: points along one run are not "
                "separate budgets"
            )
        seen[key] = index
        observations.append(Observation(interface, seed, tokens, loss, params))
    if not observations:
        raise ValueError("no observations")
    return observations


@dataclass(frozen=True)
class Design:
    """The points of one fit: ``x`` the budgets (tokens, or parameters), ``seeds`` those with a run at every
    budget for every interface, ``loss[interface]`` (seeds, budgets), ``left_out`` the seeds that lack a run
    (and which)."""

    x_name: str
    x: np.ndarray
    seeds: list[int]
    loss: dict[str, np.ndarray]
    left_out: list[str]


def check_design(
    observations: Sequence[Observation],
    x_name: str = "tokens",
    min_budgets: int = MIN_BUDGETS,
    min_span: float = MIN_SPAN,
    what_for: str = "a fit",
) -> Design:
    """The paired design of a set of observations that share everything but ``x_name`` (tokens, or params),
    or a ValueError naming what is short: fewer than ``min_budgets`` budgets (5), a span under ``min_span``
    (16×), fewer than 3 seeds with a run at every budget for every interface (saying which runs are missing).
    ``what_for`` names what needs them in the message (a backtest asks for fewer budgets than a fit)."""
    if x_name not in ("tokens", "params"):
        raise ValueError(f"x_name: expected 'tokens' or 'params', got {x_name!r}")
    what = "budgets" if x_name == "tokens" else "model sizes"
    values = {o.interface: {} for o in observations}
    for o in observations:
        x = getattr(o, x_name)
        if x is None:
            raise ValueError(f"{o.interface} seed {o.seed}: no {x_name} given")
        per_x = values[o.interface].setdefault(o.seed, {})
        if x in per_x:
            raise ValueError(f"{o.interface} seed {o.seed}: two runs at {x_name} {human(x)} in one fit")
        per_x[x] = o.loss
    xs = sorted({x for per_seed in values.values() for runs in per_seed.values() for x in runs})
    if len(xs) < min_budgets:
        raise ValueError(
            f"{what_for} needs {min_budgets} or more {what}, got {len(xs)} ({', '.join(map(human, xs))})"
        )
    span = xs[-1] / xs[0]
    if span < min_span * (1 - SPAN_ROUNDING):
        raise ValueError(
            f"{what_for} needs {what} spanning {min_span:g}× or more, got {stats.fmt(span)}× "
            f"({human(xs[0])} to {human(xs[-1])})"
        )
    all_seeds = sorted({seed for per_seed in values.values() for seed in per_seed})
    complete, missing = [], []
    for seed in all_seeds:
        gaps = [
            f"{name} at {human(x)}"
            for name, per_seed in values.items()
            for x in xs
            if x not in per_seed.get(seed, {})
        ]
        if gaps:
            missing.append(f"seed {seed} lacks {', '.join(gaps)}")
        else:
            complete.append(seed)
    if len(complete) < MIN_SEEDS:
        raise ValueError(
            f"{what_for} needs {MIN_SEEDS} or more seeds with a run at every one of the {len(xs)} {what} for every "
            f"interface ({', '.join(values)}), got {len(complete)}"
            + (f" ({', '.join(map(str, complete))})" if complete else "")
            + (f"; {'; '.join(missing)}" if missing else "")
        )
    loss = {
        name: np.array([[per_seed[seed][x] for x in xs] for seed in complete])
        for name, per_seed in values.items()
    }
    return Design(x_name, np.array(xs, dtype=np.float64), complete, loss, missing)


def groups_by_tokens_per_param(observations: Sequence[Observation]) -> list[tuple[float, list[Observation]]]:
    """Observations grouped by tokens per parameter, a ratio within ``RATIO_TOLERANCE`` of the group's smallest
    joining it (budgets are whole steps, so one intended ratio is realised a little differently at each
    size); each group is labelled by its geometric-mean ratio to 3 significant digits."""
    groups: list[list[Observation]] = []
    for o in sorted(observations, key=lambda o: o.tokens / o.params):
        ratio = o.tokens / o.params
        if groups and ratio <= groups[-1][0].tokens / groups[-1][0].params * (1 + RATIO_TOLERANCE):
            groups[-1].append(o)
        else:
            groups.append([o])
    return [
        (float(f"{math.exp(np.mean([math.log(o.tokens / o.params) for o in g])):.3g}"), g) for g in groups
    ]


def _positive(value: object, where: str, field: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{where}: field {field!r} must be a positive finite number, got {value!r}")
    return float(value)
