"""Seed-resampled intervals of fitted curves: the resamples, their weighted quantiles, the expanded percentile
interval.

**The intervals.** The seeds are the independent units: runs of one seed share the initialisation and the data
order, so their points at different budgets (and of different interfaces) are correlated. A resample draws S
seeds with replacement, *the same draw for every interface*, and refits every interface on the drawn seeds'
points (each seed's points weighted by how often it was drawn); refits start from the full fit's distinct
solutions (up to ``RESAMPLE_STARTS``). When the seeds have at most ``n_boot`` distinct resamples (multisets:
126 for 5 seeds) every one is refitted and weighted by its probability, the exact bootstrap distribution, so an
interval's edge carries no Monte Carlo error; otherwise ``n_boot`` random resamples with a fixed RNG seed.
Intervals are *expanded* percentile intervals of the refits (``tail_probability``: a plain percentile
interval from 5 seeds runs narrow). The simulation test in ``tests/test_scaling.py`` measures their coverage,
and shows that resampling points instead of seeds misses the interpolated loss more often.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from tablefree import stats
from tablefree.scaling.fits import fit_from_grid, refit

DEFAULT_BOOTSTRAP = 2000


@dataclass(frozen=True)
class Draws:
    """The resamples of one analysis: ``weights`` (R, seeds·budgets) multiply each point's loss term (seed-major,
    like ``loss.ravel()``), ``probs`` (R,) the probability of each resample."""

    weights: np.ndarray
    probs: np.ndarray
    description: str


def resamples(rng: np.random.Generator, n_seeds: int, n_x: int, n_boot: int, resample: str) -> Draws:
    """Resamples of the seeds (each drawn seed brings all its points): every multiset of ``n_seeds`` draws with
    its multinomial probability when there are at most ``n_boot`` of them (126 for 5 seeds: the exact bootstrap
    distribution, so an interval's edge carries no Monte Carlo error), else ``n_boot`` random draws of equal
    probability. ``resample="points"`` draws points instead (always random)."""
    if resample == "seeds" and math.comb(2 * n_seeds - 1, n_seeds) <= n_boot:
        counts = np.array(
            [
                np.bincount(c, minlength=n_seeds)
                for c in itertools.combinations_with_replacement(range(n_seeds), n_seeds)
            ],
            dtype=np.float64,
        )
        log_probs = (
            math.lgamma(n_seeds + 1)
            - np.array([sum(math.lgamma(k + 1) for k in row) for row in counts])
            - n_seeds * math.log(n_seeds)
        )
        return Draws(
            np.repeat(counts, n_x, axis=1),
            np.exp(log_probs),
            f"all {len(counts)} multisets of {n_seeds} seeds drawn with replacement, each with its probability",
        )
    units = n_seeds if resample == "seeds" else n_seeds * n_x
    draws = rng.integers(0, units, size=(n_boot, units))
    counts = np.stack([np.bincount(d, minlength=units) for d in draws]).astype(np.float64)
    weights = np.repeat(counts, n_x, axis=1) if resample == "seeds" else counts
    what = "seeds" if resample == "seeds" else "points"
    return Draws(weights, np.full(n_boot, 1.0 / n_boot), f"{n_boot} random resamples of the {what}")


def quantile(values: np.ndarray, q: float, probs: np.ndarray) -> np.ndarray:
    """The q-quantile (inverted CDF) along axis 0 of ``values`` (R,) or (R, G), row r with probability
    ``probs[r]``."""
    flat = np.asarray(values, dtype=np.float64).reshape(len(probs), -1)
    order = np.argsort(flat, axis=0, kind="stable")
    cumulative = np.cumsum(probs[order], axis=0)
    first = np.argmax(cumulative >= q * cumulative[-1] * (1 - 1e-12), axis=0)
    picked = np.take_along_axis(flat, np.take_along_axis(order, first[None], axis=0), axis=0)[0]
    return picked.reshape(np.shape(values)[1:])


def interval(values: np.ndarray, estimate: float, level: float, probs: np.ndarray) -> dict:
    return {
        "estimate": float(estimate),
        "low": float(quantile(values, level, probs)),
        "high": float(quantile(values, 1 - level, probs)),
    }


def band(curves: np.ndarray, level: float, probs: np.ndarray) -> dict:
    """Row 0 the full fit's curve, rows 1.. the resamples'."""
    return {
        "estimate": curves[0].tolist(),
        "low": quantile(curves[1:], level, probs).tolist(),
        "high": quantile(curves[1:], 1 - level, probs).tolist(),
    }


def tail_probability(confidence: float, units: int) -> float:
    """The lower percentile of an expanded percentile interval (Hesterberg 2015, "What teachers should know
    about the bootstrap"): Φ(−√(n/(n−1))·t(1 − α/2, n − 1)) for n resampled units. A plain percentile interval
    from n = 5 seeds has the width of a z interval on a variance shrunk by (n − 1)/n, and covers about 85% for
    a nominal 95%; the expansion restores the t interval's width."""
    alpha = 1 - confidence
    z = math.sqrt(units / (units - 1)) * stats.student_t_ppf(1 - alpha / 2, units - 1)
    return NormalDist().cdf(-z)


def fit_with_resamples(x: np.ndarray, loss: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full fit (grid of starts) and the (R, 3) resample refits of one interface; ``loss`` (seeds, x)."""
    log_x = np.log(np.tile(x, loss.shape[0]))
    log_y = np.log(loss.ravel())
    theta, _, starts = fit_from_grid(log_x, log_y, np.ones((1, log_x.size)))
    return theta[0], refit(log_x, log_y, weights, starts)


def fit_dict(theta: np.ndarray, boot: np.ndarray, level: float, probs: np.ndarray) -> dict:
    return {
        "E": interval(np.exp(boot[:, 0]), np.exp(theta[0]), level, probs),
        "B": interval(np.exp(boot[:, 1]), np.exp(theta[1]), level, probs),
        "beta": interval(boot[:, 2], theta[2], level, probs),
    }
