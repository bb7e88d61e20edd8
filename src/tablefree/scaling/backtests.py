"""The backtest of a fit: refitted without its largest budgets, what did it predict there?

**The backtest, always.** Every fit is repeated without the largest budget; it predicts the largest budget's
mean loss (and each pair's gap), and the result reports the error with its interval, from the same resamples
on both sides (the refit's prediction minus the resample's observed mean, so the observed mean's own seed noise
counts); the check passes when that interval includes 0. So the extrapolation has been checked over one step,
largest / second-largest budget; every prediction says how far beyond the largest budget it reaches. The
backtest fits one budget fewer than the design needs (4 budgets for the smallest design): it is a check of the
fit, not a fit to report.
"""

from __future__ import annotations

import numpy as np

from tablefree.scaling.intervals import Draws, interval
from tablefree.scaling.observations import EXACT


def check_backtest(
    predicted: float,
    predicted_boot: np.ndarray,
    per_seed: np.ndarray,
    held_out: float,
    draws: Draws,
    level: float,
) -> dict:
    """The fit without the largest budget against what was measured there: ``predicted`` (the full refit's) and
    ``predicted_boot`` (R,) (each resample's) at the largest budget, ``per_seed`` the measured values there.
    The error's interval comes from the same resamples on both sides (resample r's prediction minus resample
    r's observed mean), so it holds the observed mean's own seed noise as well as the fit's; the check passes
    (``covered``) when that interval includes 0. ``low``/``high`` bound the prediction alone. A resample that
    drew no point at the largest budget (possible when points, not seeds, are resampled) has no observed mean
    and is left out of the error's interval."""
    n_x = draws.weights.shape[1] // per_seed.size
    held = draws.weights[:, n_x - 1 :: n_x]  # each seed's weight at the largest budget
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
