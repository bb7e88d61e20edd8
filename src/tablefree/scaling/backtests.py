"""The backtest of a fit: refitted without its largest budgets, what did it predict there?

**The backtest, always.** Every fit is repeated without the largest budget; it predicts the largest budget's
mean loss (and each pair's gap), and the result reports the error with its interval, from the same resamples
on both sides (the refit's prediction minus the resample's observed mean, so the observed mean's own seed noise
counts); the check passes when that interval includes 0. So the extrapolation has been checked over one step,
largest / second-largest budget; every prediction says how far beyond the largest budget it reaches. The
backtest fits one budget fewer than the design needs (4 budgets for the smallest design): it is a check of the
fit, not a fit to report.

**Expanding windows.** The same check for every window: fitted on the first k budgets of the fit window, for
every k from the number of the form's parameters up, each remaining budget predicted (``expanding_backtests``),
for each functional form of ``forms``; so an extrapolation is checked over every reach the budgets allow, not only
one step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tablefree.scaling.forms import Form
from tablefree.scaling.intervals import Draws, interval
from tablefree.scaling.observations import EXACT, Design


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
    }


def expanding_backtests(
    design: Design, form: Form, draws: Draws, level: float, pairs: Sequence[tuple[str, str]]
) -> dict:
    """The backtest by expanding windows: for every k from the number of ``form``'s parameters to one budget
    fewer than the window has, fit on the first k budgets and check the prediction of every remaining budget,
    for each interface's mean loss and each pair's mean gap (``check_backtest``: the error's interval from the
    same seed resamples on both sides). A window of at most as many budgets as the form has parameters is
    refused with the reason: no trend is read from too few points."""
    n_seeds, n_x = next(iter(design.loss.values())).shape
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
            theta, boot = form.fit(design.x[:k], loss[:, :k], draws.weights[:, keep])
            curves[name] = form.curve(np.vstack([theta[None], boot]), design.x[k:])
        checks = []
        for j, x in enumerate(design.x[k:]):
            column = k + j
            for name, curve in curves.items():
                measured = design.loss[name][:, column]
                checks.append(
                    {
                        "interface": name,
                        **check_backtest(curve[0, j], curve[1:, j], measured, x, draws, level, column),
                    }
                )
            for a, b in pairs:
                gap = curves[a][:, j] - curves[b][:, j]
                measured = (design.loss[a] - design.loss[b])[:, column]
                checks.append(
                    {"pair": [a, b], **check_backtest(gap[0], gap[1:], measured, x, draws, level, column)}
                )
        out["windows"].append(
            {
                "budgets": k,
                "fitted_up_to": float(design.x[k - 1]),
                "passed": sum(c["covered"] for c in checks),
                "checks": checks,
            }
        )
    return out
