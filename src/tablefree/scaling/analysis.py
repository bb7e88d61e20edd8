"""One fit with everything it derives: per interface the fit, its intervals, its check against its points and
its backtest; per pair the gap, its change per doubling, the budget to parity.

**Does the curve describe the points?** Each fit is checked against the points it was fitted to: its miss of
each budget's mean loss, in units of that mean's seed standard error, against a t limit (Bonferroni over the
budgets); a fit that fails says so first, and what it derives is then not a result. A floor E fitted to 0 (a
pure power law) is said too.

**What is derived.** For a pair of interfaces A, B: the fitted gap L_A(D) − L_B(D) at any budget; its change
per doubling of D at the largest budget, ln 2 · d(gap)/d(ln D); and the budget to parity, the first D at or
above the smallest budget where the fitted curves cross, searched up to a horizon (default 1e12 tokens): with
an interval where the resamples cross, or "no crossing before the horizon" with the share of resamples that
cross before it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from tablefree import stats
from tablefree.fileio import strict_json
from tablefree.scaling.backtests import (
    PER_SEED_BELOW,
    check_backtest,
    check_backtest_per_seed,
    expanding_backtests,
    per_seed_draws,
)
from tablefree.scaling.fits import log_curve
from tablefree.scaling.forms import FORMS, OFFSET_POWER_LAW
from tablefree.scaling.intervals import (
    DEFAULT_BOOTSTRAP,
    Draws,
    band,
    fit_dict,
    fit_with_resamples,
    interval,
    quantile,
    resamples,
    tail_probability,
)
from tablefree.scaling.observations import EXACT, Observation, check_design
from tablefree.scaling.sentences import adequacy_sentences, backtest_sentences, fit_sentence, pair_sentences
from tablefree.units import human

DEFAULT_HORIZON = 1e12
GRID_POINTS = 400  # log-spaced points for curves, the parity search and the figures


def analyse(
    observations: Sequence[Observation],
    pairs: Sequence[tuple[str, str]] | None = None,
    x_name: str = "tokens",
    predict_at: Sequence[float] = (),
    horizon: float = DEFAULT_HORIZON,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = stats.DEFAULT_SEED,
    confidence: float = 0.95,
    resample: str = "seeds",
    expand: bool = True,
) -> dict:
    """Fits, intervals, pair gaps, parity and the backtest for observations that differ only in ``x_name``
    (one model size for tokens; one tokens-per-parameter ratio for params). Raises ValueError when the design
    is short (``check_design``). ``pairs`` (A, B) compare A − B (default: every pair, in order of first
    appearance). ``resample="points"`` resamples points instead of seeds: wrong (points of one seed are
    correlated) and kept only so that the simulation test can show it undercovers."""
    if resample not in ("seeds", "points"):
        raise ValueError(f"resample: expected 'seeds' or 'points', got {resample!r}")
    if not 0 < confidence < 1 or n_boot < 1:
        raise ValueError("analyse needs 0 < confidence < 1 and n_boot ≥ 1")
    design = check_design(observations, x_name)
    names = list(design.loss)
    pairs = list(itertools.combinations(names, 2)) if pairs is None else [tuple(p) for p in pairs]
    for a, b in pairs:
        for name in (a, b):
            if name not in design.loss:
                raise ValueError(f"pair ({a}, {b}): no observations of {name!r} (have {', '.join(names)})")
    n_seeds, n_x = design.loss[names[0]].shape
    draws = resamples(np.random.default_rng(seed), n_seeds, n_x, n_boot, resample)
    weights, probs = draws.weights, draws.probs
    held_out = design.x[-1]
    fit_x = design.x[:-1]
    grid = np.geomspace(design.x[0], max(horizon, held_out), GRID_POINTS)
    requested = sorted({float(x) for x in predict_at} | {float(held_out)})
    units = n_seeds if resample == "seeds" else n_seeds * n_x
    level = tail_probability(confidence, units) if expand else (1 - confidence) / 2
    # below PER_SEED_BELOW seeds the backtest refits each seed alone (a t interval), not the seed resamples
    by_seed = per_seed_draws(n_seeds, n_x) if resample == "seeds" and n_seeds < PER_SEED_BELOW else None
    fits, back = {}, {}
    for name in names:
        fits[name] = fit_with_resamples(design.x, design.loss[name], weights)
        keep = np.tile(np.arange(n_x) < n_x - 1, n_seeds)
        back_weights = (by_seed.weights if by_seed is not None else weights)[:, keep]
        back[name] = fit_with_resamples(fit_x, design.loss[name][:, :-1], back_weights)
    out_interfaces = {}
    for name in names:
        theta, boot = fits[name]
        rows = np.vstack([theta[None], boot])
        curve = np.exp(log_curve(rows, np.log(grid)))
        at = np.exp(log_curve(rows, np.log(requested)))
        out_interfaces[name] = {
            "fit": fit_dict(theta, boot, level, probs),
            "adequacy": check_adequacy(
                np.exp(log_curve(theta[None], np.log(design.x)))[0],
                math.exp(theta[0]),
                design.x,
                design.loss[name],
                confidence,
            ),
            "predictions": [
                {"x": x, "reach": x / held_out, **interval(at[1:, i], at[0, i], level, probs)}
                for i, x in enumerate(requested)
            ],
            "curve": {"x": grid.tolist(), **band(curve, level, probs)},
            "mean_loss": design.loss[name].mean(axis=0).tolist(),
            "backtest": {
                **_backtest(
                    float(curve_at(back[name][0][None], held_out)[0]),
                    curve_at(back[name][1], held_out),
                    design.loss[name][:, -1],
                    held_out,
                    draws,
                    level,
                    confidence,
                    by_seed is not None,
                ),
                "fitted_from": float(design.x[0]),
                "fitted_up_to": float(fit_x[-1]),
            },
        }
    out_pairs = [
        _pair(
            a, b, fits, back, design, grid, requested, horizon, level, confidence, draws, by_seed is not None
        )
        for a, b in pairs
    ]
    result = {
        "x": x_name,
        "budgets": design.x.tolist(),
        "seeds": design.seeds,
        "left_out": design.left_out,
        "largest": float(held_out),
        "backtest_fitted_up_to": float(fit_x[-1]),
        "checked_ratio": float(held_out / fit_x[-1]),
        "horizon": float(horizon),
        "confidence": confidence,
        "n_boot": n_boot,
        "rng_seed": seed,
        "resample": resample,
        "resamples": draws.description,
        "interval": "expanded percentile" if expand else "percentile",
        "backtest_method": (
            f"per-seed refits and a t interval on {n_seeds - 1} df (fewer than {PER_SEED_BELOW} seeds)"
            if by_seed is not None
            else f"the {'expanded ' if expand else ''}percentile interval over the seed resamples"
        ),
        "tail_probability": level,
        "interfaces": out_interfaces,
        "pairs": out_pairs,
    }
    result["describes_points"] = all(i["adequacy"]["describes_points"] for i in out_interfaces.values())
    result["sentences"] = (  # a curve that misses its points says so first
        [s for name, i in out_interfaces.items() for s in adequacy_sentences(name, i["adequacy"], design)]
        + [fit_sentence(result, design)]
        + [s for p in out_pairs for s in p["sentences"]]
    )
    return strict_json(result)


def check_adequacy(
    fitted: np.ndarray, floor: float, x: np.ndarray, loss: np.ndarray, confidence: float
) -> dict:
    """Does the fitted curve pass through the points it was fitted to? Per budget, the full fit's miss of the
    mean loss over seeds in units of that mean's seed standard error; the curve describes the points when
    every miss is within the two-sided t limit at ``confidence``, Bonferroni over the budgets. Also whether the
    floor E went to 0 (the fit is then a pure power law). ``fitted``: the fit's values at the budgets ``x``;
    ``floor``: its E. The check is lenient by design: the standard error
    keeps the seeds' shared offsets (which a curve followed by the median seed does not remove), and with 3
    seeds the limit is 9.9×; it catches a curve of the wrong shape, not a small misfit. (Judging the misses
    against each seed's shape alone flagged one in five true power laws of the simulation.)"""
    n_seeds = loss.shape[0]
    mean = loss.mean(axis=0)
    error = np.maximum(loss.std(axis=0, ddof=1) / math.sqrt(n_seeds), 1e-12)
    miss = fitted - mean
    ratio = np.where(np.abs(miss) <= EXACT, 0.0, np.abs(miss) / error)  # noiseless points: a miss of rounding
    limit = stats.student_t_ppf(1 - (1 - confidence) / (2 * len(x)), n_seeds - 1)
    worst = int(ratio.argmax())
    return {
        "miss": miss.tolist(),
        "standard_error": error.tolist(),
        "limit": float(limit),
        "worst_at": float(x[worst]),
        "worst_miss": float(miss[worst]),
        "worst_ratio": float(ratio[worst]),
        "describes_points": bool((ratio <= limit).all()),
        "floor_at_zero": bool(floor < 1e-3 * float(mean.min())),
    }


def curve_at(theta: np.ndarray, x: float) -> np.ndarray:
    """(R,) values at x of the curves of theta rows (R, 3)."""
    return np.exp(log_curve(theta, np.log([x])))[:, 0]


def _backtest(
    predicted: float,
    predicted_rows: np.ndarray,
    per_seed: np.ndarray,
    held_out: float,
    draws: Draws,
    level: float,
    confidence: float,
    by_seed: bool,
) -> dict:
    """``check_backtest_per_seed`` where ``predicted_rows`` are each seed's own refit's, else ``check_backtest``
    over the seed resamples."""
    if by_seed:
        return check_backtest_per_seed(predicted, predicted_rows, per_seed, held_out, confidence)
    return check_backtest(predicted, predicted_rows, per_seed, held_out, draws, level)


def _pair(
    a, b, fits, back, design, grid, requested, horizon, level, confidence, draws: Draws, by_seed: bool = False
) -> dict:
    (theta_a, boot_a), (theta_b, boot_b) = fits[a], fits[b]
    rows_a, rows_b = np.vstack([theta_a[None], boot_a]), np.vstack([theta_b[None], boot_b])
    largest = float(design.x[-1])
    probs = draws.probs

    def gap_at(x: np.ndarray, ta: np.ndarray, tb: np.ndarray) -> np.ndarray:
        log_x = np.log(x)
        return np.exp(log_curve(ta, log_x)) - np.exp(log_curve(tb, log_x))

    gaps = gap_at(np.array(requested), rows_a, rows_b)
    gap_at_list = [
        {**interval(gaps[1:, i], gaps[0, i], level, probs), "x": x, "reach": x / largest}
        for i, x in enumerate(requested)
    ]
    slopes = math.log(2) * (_dlog_slope(rows_a, largest) - _dlog_slope(rows_b, largest))
    change = {**interval(slopes[1:], slopes[0], level, probs), "at": largest}
    observed_gap = (design.loss[a] - design.loss[b]).mean(axis=0)
    parity = _parity(rows_a, rows_b, float(design.x[0]), horizon, level, probs)
    (bt_a, bt_boot_a), (bt_b, bt_boot_b) = back[a], back[b]
    bt = gap_at(np.array([largest]), np.vstack([bt_a[None], bt_boot_a]), np.vstack([bt_b[None], bt_boot_b]))
    per_seed = (design.loss[a] - design.loss[b])[:, -1]
    backtest = {
        **_backtest(float(bt[0, 0]), bt[1:, 0], per_seed, largest, draws, level, confidence, by_seed),
        "fitted_from": float(design.x[0]),
        "fitted_up_to": float(design.x[-2]),
    }
    result = {
        "a": a,
        "b": b,
        "gap_at": gap_at_list,
        "change_per_doubling": change,
        "parity": parity,
        "backtest": backtest,
        "observed_gap": observed_gap.tolist(),
        "gap_curve": {"x": grid.tolist(), **band(gap_at(grid, rows_a, rows_b), level, probs)},
    }
    result["sentences"] = pair_sentences(result, design, confidence)
    return result


def _dlog_slope(theta: np.ndarray, x: float) -> np.ndarray:
    """dL/d(ln x) = −beta·B·x^(−beta) per row."""
    return -theta[:, 2] * np.exp(theta[:, 1] - theta[:, 2] * math.log(x))


def _parity(
    rows_a: np.ndarray, rows_b: np.ndarray, start: float, horizon: float, level: float, probs: np.ndarray
) -> dict:
    """The first x in [start, horizon] where the curves cross, per row (row 0 the full fit), by a sign change
    on a log grid refined by bisection in log x."""
    log_grid = np.linspace(math.log(start), math.log(horizon), 2000)

    def gap(log_x: np.ndarray) -> np.ndarray:  # (R, G) or (R,) for per-row log_x
        if log_x.ndim == 1:
            return np.exp(log_curve(rows_a, log_x)) - np.exp(log_curve(rows_b, log_x))
        za = np.logaddexp(rows_a[:, 0:1], rows_a[:, 1:2] - rows_a[:, 2:3] * log_x)
        zb = np.logaddexp(rows_b[:, 0:1], rows_b[:, 1:2] - rows_b[:, 2:3] * log_x)
        return np.exp(za) - np.exp(zb)

    values = gap(log_grid)
    sign = np.sign(values)
    change = sign[:, 1:] != sign[:, :1]
    crosses = change.any(axis=1)
    first = change.argmax(axis=1)
    low = log_grid[first][:, None]
    high = log_grid[np.minimum(first + 1, log_grid.size - 1)][:, None]
    start_sign = sign[:, :1]
    for _ in range(40):
        mid = 0.5 * (low + high)
        same = np.sign(gap(mid)) == start_sign
        low, high = np.where(same, mid, low), np.where(same, high, mid)
    at = np.where(crosses, np.exp(0.5 * (low + high))[:, 0], np.inf)
    share = float(probs @ crosses[1:] / probs.sum())
    reach = {"start": start, "horizon": horizon, "share_crossing": share}
    if not crosses[0]:
        return {
            **reach,
            "estimate": None,
            "low": None,
            "high": None,
            "reason": f"the fitted curves do not cross between {human(start)} and {human(horizon)}",
        }
    # resamples that never cross count as crossing beyond the horizon: the upper bound is then unknown
    q_low, q_high = quantile(at[1:], level, probs), quantile(at[1:], 1 - level, probs)
    return {
        **reach,
        "estimate": float(at[0]),
        "low": float(q_low) if math.isfinite(q_low) else None,
        "high": float(q_high) if math.isfinite(q_high) else None,
        "reason": None
        if math.isfinite(q_high)
        else f"over {100 * (1 - share):.0f}% of resamples do not cross before {human(horizon)}",
    }


def form_checks(
    observations: Sequence[Observation],
    pairs: Sequence[tuple[str, str]] | None = None,
    predict_at: Sequence[float] = (),
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = stats.DEFAULT_SEED,
    confidence: float = 0.95,
) -> dict:
    """Beside ``analyse`` (observations against tokens, the same seed resamples): the expanding-window
    backtests of both functional forms (``backtests.expanding_backtests``), which need one budget more than the
    form has parameters and 3 seeds; and, where the design allows a fit (``check_design``: 5 budgets over 16×),
    the second form fitted to every budget with its check against its points and its predictions, else its
    refusal. Raises ValueError when even the backtests cannot run."""
    smallest = min(len(f.parameters) for f in FORMS) + 1
    design = check_design(observations, "tokens", min_budgets=smallest, min_span=1.0, what_for="a backtest")
    names = list(design.loss)
    pairs = list(itertools.combinations(names, 2)) if pairs is None else [tuple(p) for p in pairs]
    n_seeds, n_x = design.loss[names[0]].shape
    draws = resamples(np.random.default_rng(seed), n_seeds, n_x, n_boot, "seeds")
    level = tail_probability(confidence, n_seeds)
    backtests = [
        {**expanding_backtests(design, f, draws, level, pairs, confidence), "confidence": confidence}
        for f in FORMS
    ]
    try:
        check_design(observations, "tokens")
        second = _second_form(design, pairs, predict_at, draws, level, confidence)
        second_sentences = second["sentences"]
    except ValueError as error:
        second = {"form": OFFSET_POWER_LAW.name, "formula": OFFSET_POWER_LAW.formula, "refused": str(error)}
        second_sentences = [f"No fit of the {OFFSET_POWER_LAW.name} ({OFFSET_POWER_LAW.formula}): {error}."]
    return strict_json(
        {
            "second_form": second,
            "expanding_backtests": backtests,
            "sentences": second_sentences + [s for b in backtests for s in backtest_sentences(b)],
        }
    )


def _second_form(design, pairs, predict_at, draws: Draws, level: float, confidence: float) -> dict:
    """The offset power law fitted to every budget of the design: per interface its parameters with their
    intervals, its check against its points and its predictions; per pair its gap at the requested budgets."""
    form = OFFSET_POWER_LAW
    largest = float(design.x[-1])
    requested = np.array(sorted({float(x) for x in predict_at} | {largest}))
    rows, interfaces = {}, {}
    for name, loss in design.loss.items():
        theta, boot = form.fit(design.x, loss, draws.weights)
        rows[name] = np.vstack([theta[None], boot])
        values = form.values(rows[name], design.x)
        at = form.curve(rows[name], requested)
        interfaces[name] = {
            "fit": {k: interval(v[1:], v[0], level, draws.probs) for k, v in values.items()},
            "adequacy": check_adequacy(
                form.curve(theta[None], design.x)[0], float(values["E"][0]), design.x, loss, confidence
            ),
            "predictions": [
                {"x": x, "reach": x / largest, **interval(at[1:, i], at[0, i], level, draws.probs)}
                for i, x in enumerate(requested.tolist())
            ],
        }
    out_pairs = []
    for a, b in pairs:
        gaps = form.curve(rows[a], requested) - form.curve(rows[b], requested)
        gap_at = [
            {"x": x, "reach": x / largest, **interval(gaps[1:, i], gaps[0, i], level, draws.probs)}
            for i, x in enumerate(requested.tolist())
        ]
        out_pairs.append({"a": a, "b": b, "gap_at": gap_at})
    return {
        "form": form.name,
        "formula": form.formula,
        "refused": None,
        "budgets": design.x.tolist(),
        "seeds": design.seeds,
        "interfaces": interfaces,
        "pairs": out_pairs,
        "describes_points": all(i["adequacy"]["describes_points"] for i in interfaces.values()),
        "sentences": [
            s
            for name, i in interfaces.items()
            for s in adequacy_sentences(name, i["adequacy"], design, form.formula)
        ],
    }
