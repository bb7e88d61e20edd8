"""The backtest of a fit: refitted without its largest budgets, what did it predict there?

**The backtest, always.** Every fit is repeated without the largest budget; it predicts the largest budget's
mean loss (and each pair's gap), and the result reports the error with its interval, from the same resamples
on both sides (the refit's prediction minus the resample's observed mean, so the observed mean's own seed noise
counts); the check passes when that interval includes 0. So the extrapolation has been checked over one step,
largest / second-largest budget; every prediction says how far beyond the largest budget it reaches. The
backtest fits one budget fewer than the design needs (4 budgets for the smallest design): it is a check of the
fit, not a fit to report.

**Few seeds.** Below ``PER_SEED_BELOW`` seeds the resamples are too few to give an interval (3 seeds have 10
distinct resamples, so an "interval" is the range of 10 refits, and a refit that jumps to another optimum
widens it past any real error): the check then refits each seed's own points (``per_seed_draws``), takes each
seed's error (its refit's prediction minus its own measured value) and passes when the t interval of the mean
error on S − 1 degrees of freedom includes 0 (``check_backtest_per_seed``). Every check names its method.

**Expanding windows.** The same check for every window: fitted on the first k budgets of the fit window, for
every k from the number of the form's parameters up, each remaining budget predicted (``expanding_backtests``),
for each functional form of ``forms``; so an extrapolation is checked over every reach the budgets allow, not only
one step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tablefree import stats
from tablefree.scaling.forms import Form
from tablefree.scaling.intervals import Draws, interval
from tablefree.scaling.observations import EXACT, Design

PER_SEED_BELOW = 5  # fewer seeds: per-seed refits and a t interval, not the range of a handful of resamples


def per_seed_draws(n_seeds: int, n_x: int) -> Draws:
    """One "resample" per seed that holds only that seed's points: refitted with these weights, each row is
    that seed's own fit."""
    return Draws(
        np.repeat(np.eye(n_seeds), n_x, axis=1),
        np.full(n_seeds, 1.0 / n_seeds),
        f"each of the {n_seeds} seeds refitted on its own points",
    )


def check_backtest_per_seed(
    predicted: float, predicted_per_seed: np.ndarray, per_seed: np.ndarray, held_out: float, confidence: float
) -> dict:
    """The backtest with few seeds: ``predicted_per_seed`` (S,) each seed's own refit's prediction at the held-out
    budget, ``per_seed`` (S,) each seed's measured value there; the error's interval is the t interval (S − 1
    df) of the mean per-seed error, and the check passes when it includes 0. ``predicted`` is the mean of the
    per-seed predictions (so that ``error`` = ``predicted`` − ``observed``), ``low``/``high`` its t interval;
    ``predicted_all_seeds`` is the prediction of the fit to every seed's points, ``predicted``."""
    seeds = per_seed.size
    errors = np.asarray(predicted_per_seed, dtype=np.float64) - per_seed
    t = stats.student_t_ppf(0.5 + confidence / 2, seeds - 1)

    def t_interval(values: np.ndarray) -> tuple[float, float, float]:
        mean = float(values.mean())
        half = t * float(values.std(ddof=1)) / math.sqrt(seeds)
        return mean, mean - half, mean + half

    mean_prediction, low, high = t_interval(np.asarray(predicted_per_seed, dtype=np.float64))
    error, error_low, error_high = t_interval(errors)
    return {
        "at": float(held_out),
        "predicted": mean_prediction,
        "predicted_all_seeds": float(predicted),
        "low": low,
        "high": high,
        "observed": float(per_seed.mean()),
        "error": error,
        "error_low": error_low,
        "error_high": error_high,
        "per_seed_error": errors.tolist(),
        "covered": bool(error_low - EXACT <= 0 <= error_high + EXACT),
        "method": f"per-seed refits, {100 * confidence:g}% t interval on {seeds - 1} df",
    }


def check_backtest(
    predicted: float,
    predicted_boot: np.ndarray,
    per_seed: np.ndarray,
    held_out: float,
    draws: Draws,
    level: float,
    column: int = -1,
) -> dict:
    """The fit without the largest budget against what was measured there: ``predicted`` (the full refit's) and
    ``predicted_boot`` (R,) (each resample's) at the largest budget, ``per_seed`` the measured values there.
    The error's interval comes from the same resamples on both sides (resample r's prediction minus resample
    r's observed mean), so it holds the observed mean's own seed noise as well as the fit's; the check passes
    (``covered``) when that interval includes 0. ``low``/``high`` bound the prediction alone. A resample that
    drew no point at the largest budget (possible when points, not seeds, are resampled) has no observed mean
    and is left out of the error's interval. ``column``: which budget was held out (the largest by default)."""
    n_x = draws.weights.shape[1] // per_seed.size
    held = draws.weights[:, column % n_x :: n_x]  # each seed's weight at the held-out budget
    drawn = held.sum(axis=1) > 0
    observed_boot = (held[drawn] @ per_seed) / held[drawn].sum(axis=1)
    observed = float(per_seed.mean())
    prediction = interval(predicted_boot, predicted, level, draws.probs)
    error = interval(predicted_boot[drawn] - observed_boot, predicted - observed, level, draws.probs[drawn])
    return {
        "at": float(held_out),
        "predicted": float(predicted),
        "low": prediction["low"],
        "high": prediction["high"],
        "observed": observed,
        "error": error["estimate"],
        "error_low": error["low"],
        "error_high": error["high"],
        "covered": bool(error["low"] - EXACT <= 0 <= error["high"] + EXACT),
        "method": f"expanded percentile over seed resamples ({draws.description})",
    }


def expanding_backtests(
    design: Design,
    form: Form,
    draws: Draws,
    level: float,
    pairs: Sequence[tuple[str, str]],
    confidence: float = 0.95,
) -> dict:
    """The backtest by expanding windows: for every k from the number of ``form``'s parameters to one budget
    fewer than the window has, fit on the first k budgets and check the prediction of every remaining budget,
    for each interface's mean loss and each pair's mean gap (``check_backtest``: the error's interval from the
    same seed resamples on both sides). A window of at most as many budgets as the form has parameters is
    refused with the reason: no trend is read from too few points. Below ``PER_SEED_BELOW`` seeds each check
    is ``check_backtest_per_seed``'s (per-seed refits, a t interval at ``confidence``)."""
    n_seeds, n_x = next(iter(design.loss.values())).shape
    by_seed = per_seed_draws(n_seeds, n_x) if n_seeds < PER_SEED_BELOW else None
    smallest = len(form.parameters)
    out = {"form": form.name, "formula": form.formula, "smallest_fit": smallest, "windows": []}
    if n_x <= smallest:
        out["refused"] = (
            f"the {form.name} ({form.formula}) needs {smallest} budgets to fit and one more to predict; the fit "
            f"window has {n_x}"
        )
        return out
    out["refused"] = None
    for k in range(smallest, n_x):
        keep = np.tile(np.arange(n_x) < k, n_seeds)
        curves = {}
        for name, loss in design.loss.items():
            used = by_seed or draws
            theta, boot = form.fit(design.x[:k], loss[:, :k], used.weights[:, keep])
            curves[name] = form.curve(np.vstack([theta[None], boot]), design.x[k:])

        def check(curve: np.ndarray, measured: np.ndarray, x: float, column: int) -> dict:
            if by_seed is not None:
                return check_backtest_per_seed(curve[0], curve[1:], measured, x, confidence)
            return check_backtest(curve[0], curve[1:], measured, x, draws, level, column)

        checks = []
        for j, x in enumerate(design.x[k:]):
            column = k + j
            for name, curve in curves.items():
                measured = design.loss[name][:, column]
                checks.append({"interface": name, **check(curve[:, j], measured, x, column)})
            for a, b in pairs:
                gap = curves[a][:, j] - curves[b][:, j]
                measured = (design.loss[a] - design.loss[b])[:, column]
                checks.append({"pair": [a, b], **check(gap, measured, x, column)})
        out["windows"].append(
            {
                "budgets": k,
                "fitted_from": float(design.x[0]),
                "fitted_up_to": float(design.x[k - 1]),
                "passed": sum(c["covered"] for c in checks),
                "checks": checks,
            }
        )
    return out
