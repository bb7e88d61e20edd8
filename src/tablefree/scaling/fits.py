"""One fitted curve: L(x) = E + B·x^(−β), by a robust loss and a vectorised L-BFGS (numpy only).

**The model.** L(D) = E + B·D^(−β) per interface, fitted as Besiroglu et al. (2024) refit Chinchilla's
approach 3: the Huber loss (δ = 1e-3) of log L(D) − log(loss), i.e. log L = logaddexp(e, b − β·log D) with
E = exp(e) and B = exp(b), so both stay positive; minimised by L-BFGS from a grid of starting points (the best
of them wins). The fit uses every seed's point at every budget. The optimiser is a vectorised L-BFGS
(``_minimise``: two-loop recursion, backtracking Armijo line search) that runs all starts, and all bootstrap
resamples, as one batch; ``tests/test_scaling.py`` checks it against SciPy's L-BFGS-B where SciPy is installed.
Where the runs have several model sizes, the same fit over parameters at a fixed number of tokens per
parameter, L(N) = E + A·N^(−α).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HUBER_DELTA = 1e-3
SCREEN_ITERATIONS = 25  # every start of the grid gets this many L-BFGS steps ...
SURVIVORS = 12  # ... and the best this many continue to convergence
RESAMPLE_STARTS = 3  # the full fit's best and two runner-up solutions seed every resample's refit


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = E + B·x^(−beta), fitted by the Huber loss on log L; ``objective`` is that loss / δ at the fit."""

    E: float
    B: float
    beta: float
    objective: float

    def predict(self, x: float | np.ndarray) -> np.ndarray:
        return np.exp(log_curve(_theta(self)[None], np.log(np.asarray(x, dtype=np.float64)).ravel()))[0]


def fit_power_law(
    x: Sequence[float], losses: Sequence[float], weights: Sequence[float] | None = None
) -> PowerLaw:
    """The robust fit of L(x) = E + B·x^(−beta) to points (x_i, loss_i) (every seed's point at every budget):
    Huber (δ = 1e-3) on log loss, L-BFGS from a grid of starting points, the best. ``weights`` multiply each
    point's loss term (1 each when None)."""
    log_x, log_y = log_points(x, losses)
    w = np.ones(log_x.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != log_x.shape or (w < 0).any() or not np.isfinite(w).all():
        raise ValueError(f"weights: expected {log_x.size} non-negative values")
    if np.unique(log_x[w > 0]).size < 3:
        raise ValueError("a power law with an offset needs points at 3 or more distinct x")
    theta, objective, _ = fit_from_grid(log_x, log_y, w[None])
    return _power_law(theta[0], objective[0])


def fit_from_grid(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray) -> tuple:
    """Best fit per row of ``weights`` (R, N) from every start of the grid; also the distinct runner-up
    solutions of the first row, (k, 3), to seed resample refits."""
    grid = _start_grid(log_y)
    rows = weights.shape[0]
    theta, f = _minimise(
        np.tile(grid, (rows, 1)),
        log_x,
        log_y,
        np.repeat(weights, len(grid), axis=0),
        max_iter=SCREEN_ITERATIONS,
    )
    # every start runs SCREEN_ITERATIONS steps; the SURVIVORS best per row continue to convergence
    order = np.argsort(f.reshape(rows, len(grid)), axis=1)[:, :SURVIVORS]
    picked = (order + np.arange(rows)[:, None] * len(grid)).ravel()
    theta, f = _minimise(theta[picked], log_x, log_y, np.repeat(weights, SURVIVORS, axis=0))
    theta, f = theta.reshape(rows, SURVIVORS, 3), f.reshape(rows, SURVIVORS)
    best = f.argmin(axis=1)
    order = np.argsort(f[0])
    distinct = [theta[0, order[0]]]
    for i in order[1:]:
        if len(distinct) == RESAMPLE_STARTS:
            break
        if min(np.abs(theta[0, i] - d).max() for d in distinct) > 1e-3:
            distinct.append(theta[0, i])
    return theta[np.arange(rows), best], f[np.arange(rows), best], np.array(distinct)


def refit(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(R, 3) best refit per row of ``weights`` from the few ``starts`` (k, 3)."""
    rows, k = weights.shape[0], len(starts)
    theta, f = _minimise(np.tile(starts, (rows, 1)), log_x, log_y, np.repeat(weights, k, axis=0))
    theta, f = theta.reshape(rows, k, 3), f.reshape(rows, k)
    return theta[np.arange(rows), f.argmin(axis=1)]


def _start_grid(log_y: np.ndarray) -> np.ndarray:
    """Starting points scaled to the data: E a fraction of the smallest loss, B·x^(−β) at the geometric mean
    of x (where ``_minimise`` centres log x) from a tiny share of the mean loss to about all of it."""
    low, mean = float(log_y.min()), float(log_y.mean())
    e = low + np.log([0.05, 0.3, 0.6, 0.8, 0.9, 0.97])
    b = mean + np.array([-6.0, -4.0, -3.0, -2.0, -1.0, 0.0])
    beta = np.array([0.05, 0.15, 0.3, 0.5, 0.8, 1.2, 2.0])
    return np.array(list(itertools.product(e, b, beta)))  # (e, b at the centre, beta)


def _huber(
    theta: np.ndarray, u: np.ndarray, log_y: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Objective Σ w·huber(r)/δ and its gradient for rows of theta = (e, b_c, beta), with log L =
    logaddexp(e, b_c − beta·u) and u = log x − its mean (centring decorrelates b_c and beta)."""
    z = theta[:, 1:2] - theta[:, 2:3] * u
    pred = np.logaddexp(theta[:, 0:1], z)
    r = pred - log_y
    a = np.abs(r)
    loss = np.where(a <= HUBER_DELTA, 0.5 * r * r / HUBER_DELTA, a - 0.5 * HUBER_DELTA)
    psi = w * np.clip(r / HUBER_DELTA, -1.0, 1.0)
    share = np.exp(z - pred)  # ∂ log L / ∂b_c; 1 − share = ∂ log L / ∂e
    grad = np.stack([(psi * (1 - share)).sum(1), (psi * share).sum(1), -(psi * share * u).sum(1)], axis=1)
    return (w * loss).sum(1), grad


def objective(theta: np.ndarray, log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(R,) the fit's objective (Σ w·huber/δ of the log residuals) for rows of theta = (e, b, beta) at log x."""
    return _huber(theta, log_x, log_y, weights)[0]


def _minimise(
    theta0: np.ndarray,
    log_x: np.ndarray,
    log_y: np.ndarray,
    weights: np.ndarray,
    max_iter: int = 300,
    history: int = 8,
    ftol: float = 1e-11,
) -> tuple[np.ndarray, np.ndarray]:
    """L-BFGS on every row of ``theta0`` (R, 3) at once, row r weighted by ``weights[r]``; the b coordinate of
    theta is taken at the centre of log x (converted back on return). A row stops when its objective improves
    by less than ``ftol`` (relative, floored at 1), or when the line search finds no decrease."""
    centre = float(log_x.mean())
    u = log_x - centre
    theta = theta0.astype(np.float64).copy()
    theta[:, 1] -= theta[:, 2] * centre
    rows = len(theta)
    f, g = _huber(theta, u, log_y, weights)
    s_hist = np.zeros((rows, history, 3))
    y_hist = np.zeros((rows, history, 3))
    rho = np.zeros((rows, history))
    active = np.ones(rows, dtype=bool)
    for _ in range(max_iter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        gi = g[idx]
        q = gi.copy()
        alphas = np.empty((idx.size, history))
        for j in range(history):  # newest pair first
            alphas[:, j] = rho[idx, j] * np.einsum("ij,ij->i", s_hist[idx, j], q)
            q -= alphas[:, j, None] * y_hist[idx, j]
        sy = np.einsum("ij,ij->i", s_hist[idx, 0], y_hist[idx, 0])
        yy = np.einsum("ij,ij->i", y_hist[idx, 0], y_hist[idx, 0])
        gnorm = np.linalg.norm(gi, axis=1)
        gamma = np.where(rho[idx, 0] > 0, sy / np.where(yy > 0, yy, 1.0), 0.1 / np.maximum(gnorm, 1e-300))
        r = gamma[:, None] * q
        for j in reversed(range(history)):
            beta = rho[idx, j] * np.einsum("ij,ij->i", y_hist[idx, j], r)
            r += s_hist[idx, j] * (alphas[:, j] - beta)[:, None]
        p = -r
        slope = np.einsum("ij,ij->i", gi, p)
        uphill = ~(slope < 0)
        if uphill.any():  # lost curvature information: restart from steepest descent
            p[uphill] = -gi[uphill] * (0.1 / np.maximum(gnorm[uphill], 1e-300))[:, None]
            slope[uphill] = np.einsum("ij,ij->i", gi[uphill], p[uphill])
            rho[idx[uphill]] = 0.0
        step = np.ones(idx.size)
        new_theta, new_f, new_g = theta[idx].copy(), f[idx].copy(), gi.copy()
        accepted = np.zeros(idx.size, dtype=bool)
        for _ in range(40):
            pending = np.flatnonzero(~accepted)
            if pending.size == 0:
                break
            trial = theta[idx[pending]] + step[pending, None] * p[pending]
            ft, gt = _huber(trial, u, log_y, weights[idx[pending]])
            ok = ft <= f[idx[pending]] + 1e-4 * step[pending] * slope[pending]
            done = pending[ok]
            new_theta[done], new_f[done], new_g[done] = trial[ok], ft[ok], gt[ok]
            accepted[done] = True
            step[pending[~ok]] *= 0.5
        s = new_theta - theta[idx]
        y = new_g - gi
        sy_new = np.einsum("ij,ij->i", s, y)
        keep = accepted & (sy_new > 1e-12 * np.linalg.norm(s, axis=1) * np.linalg.norm(y, axis=1))
        k = idx[keep]
        s_hist[k] = np.concatenate([s[keep, None], s_hist[k, :-1]], axis=1)
        y_hist[k] = np.concatenate([y[keep, None], y_hist[k, :-1]], axis=1)
        rho[k] = np.concatenate([(1.0 / sy_new[keep])[:, None], rho[k, :-1]], axis=1)
        improvement = f[idx] - new_f
        theta[idx], f[idx], g[idx] = new_theta, new_f, new_g
        active[idx[~accepted | (improvement <= ftol * np.maximum(1.0, np.abs(new_f)))]] = False
    theta[:, 1] += theta[:, 2] * centre
    return theta, f


def log_curve(theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """(R, G) log L at log x for rows of theta = (e, b, beta)."""
    return np.logaddexp(theta[:, 0:1], theta[:, 1:2] - theta[:, 2:3] * log_x[None, :])


def _theta(fit: PowerLaw) -> np.ndarray:
    return np.array([math.log(fit.E), math.log(fit.B), fit.beta])


def _power_law(theta: np.ndarray, objective: float) -> PowerLaw:
    return PowerLaw(float(math.exp(theta[0])), float(np.exp(theta[1])), float(theta[2]), float(objective))


def log_points(x: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xs = np.asarray(x, dtype=np.float64).ravel()
    ys = np.asarray(losses, dtype=np.float64).ravel()
    if xs.shape != ys.shape or xs.size == 0:
        raise ValueError(f"expected one loss per x, got {xs.size} x and {ys.size} losses")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all() and (xs > 0).all() and (ys > 0).all()):
        raise ValueError("x and losses must be positive and finite")
    return np.log(xs), np.log(ys)
