"""The functional forms a budget study is checked against, each fitted with its seed resamples.

- ``POWER_LAW``: L = E + B·D^(−β) (``fits``), the form of the fits and their derived quantities.
- ``OFFSET_POWER_LAW``: L = E + B·(D + D0)^(−β), the second form, for where the power law fails. Small models
  on a fixed corpus first sit near the unigram level and then leave it: in log–log the curve *steepens* over the
  smallest budgets (canonical at d = 128 fell 0.043, then 0.117 nats/token per doubling over 240k–4M), which
  E + B·D^(−β), convex in log D, cannot follow. The offset D0 (the tokens "already counted" before training,
  as in Hernandez et al. 2021's effective data) bends the curve flat below D0 toward E + B·D0^(−β) and leaves it
  a power law above: one parameter more, and the power law is its D0 = 0 case. It is fitted by profiling D0
  over a log grid (0 and 12 values from D_min/32 to D_max): at each D0 the power-law fit of ``fits`` in
  x = D + D0 from the whole grid of starts (continuing from the previous D0 instead found worse optima), the
  best objective winning, for the full fit and for every resample alone. A broken power law
  needs two more parameters and a break the budgets rarely pin down; a power law of the loss minus the unigram
  level assumes the floor is the unigram level, which the learned curves pass through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tablefree.scaling.fits import fit_from_grid, log_curve, objective, refit
from tablefree.scaling.intervals import fit_with_resamples

OFFSET_GRID = 12  # D0 values besides 0, log-spaced from the smallest budget / 32 to the largest budget


@dataclass(frozen=True)
class Form:
    """A functional form: ``fit(x, loss (seeds, x), weights (R, seeds·x))`` gives the full fit's parameters
    and the resamples' (R, P); ``curve(rows (R, P), x)`` the (R, G) losses at x; ``parameters`` names P."""

    name: str
    formula: str
    parameters: tuple[str, ...]
    fit: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    curve: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def values(self, rows: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
        """Each parameter's values over ``rows`` (E and B from their logs)."""
        named = {"E": np.exp(rows[:, 0]), "B": np.exp(rows[:, 1]), "beta": rows[:, 2]}
        if len(self.parameters) > 3:
            named["D0"] = rows[:, 3]
        return named


def _power_law_curve(rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.exp(log_curve(rows, np.log(np.asarray(x, dtype=np.float64))))


def _offset_curve(rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    shifted = np.log(np.asarray(x, dtype=np.float64)[None, :] + rows[:, 3:4])
    return np.exp(np.logaddexp(rows[:, 0:1], rows[:, 1:2] - rows[:, 2:3] * shifted))


def offset_grid(x: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.geomspace(x.min() / 32, x.max(), OFFSET_GRID)])


def fit_offset_with_resamples(
    x: np.ndarray, loss: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """L = E + B·(x + D0)^(−β): the full fit and the (R, 4) resample refits, D0 profiled over ``offset_grid``."""
    log_y = np.log(loss.ravel())
    full = np.ones((1, log_y.size))
    best, best_f = None, np.inf
    boot, boot_f = np.zeros((len(weights), 4)), np.full(len(weights), np.inf)
    for d0 in offset_grid(x):
        log_x = np.log(np.tile(x + d0, loss.shape[0]))
        theta, f, starts = fit_from_grid(log_x, log_y, full)
        if f[0] < best_f:
            best, best_f = np.append(theta[0], d0), f[0]
        rows = refit(log_x, log_y, weights, starts)
        rows_f = objective(rows, log_x, log_y, weights)
        better = rows_f < boot_f
        boot[better] = np.column_stack([rows[better], np.full(better.sum(), d0)])
        boot_f[better] = rows_f[better]
    return best, boot


POWER_LAW = Form("power law", "L = E + B·D^(−β)", ("E", "B", "beta"), fit_with_resamples, _power_law_curve)
OFFSET_POWER_LAW = Form(
    "offset power law",
    "L = E + B·(D + D0)^(−β)",
    ("E", "B", "beta", "D0"),
    fit_offset_with_resamples,
    _offset_curve,
)
FORMS = (POWER_LAW, OFFSET_POWER_LAW)
