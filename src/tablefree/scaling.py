"""Fitted scaling curves: final validation loss against tokens (or parameters), extrapolated with intervals and
checked by a backtest. Pure functions of arrays and records (numpy only).

**The data.** One observation is the final validation loss of one *separate run*: an (interface, seed) pair
trained to one budget of D tokens (its own schedule, or a decay branched from a shared stable phase), with its
trainable parameter count N where known. Points along one run (the in-training estimates at 1M, 2M, … of an
8M-token run) are not separate budgets: they share one learning-rate schedule, so their losses measure the
anneal, not the budget, and their errors are correlated. ``observations_from_dicts`` refuses a second loss for
the same (interface, seed, tokens, params).

**The model.** L(D) = E + B·D^(−β) per interface, fitted as Besiroglu et al. (2024) refit Chinchilla's
approach 3: the Huber loss (δ = 1e-3) of log L(D) − log(loss), i.e. log L = logaddexp(e, b − β·log D) with
E = exp(e) and B = exp(b), so both stay positive; minimised by L-BFGS from a grid of starting points (the best
of them wins). The fit uses every seed's point at every budget. The optimiser is a vectorised L-BFGS
(``_minimise``: two-loop recursion, backtracking Armijo line search) that runs all starts, and all bootstrap
resamples, as one batch; ``tests/test_scaling.py`` checks it against SciPy's L-BFGS-B where SciPy is installed.
Where the runs have several model sizes, the same fit over parameters at a fixed number of tokens per
parameter, L(N) = E + A·N^(−α).

**The intervals.** The seeds are the independent units: runs of one seed share the initialisation and the data
order, so their points at different budgets (and of different interfaces) are correlated. A resample draws S
seeds with replacement, *the same draw for every interface*, and refits every interface on the drawn seeds'
points (each seed's points weighted by how often it was drawn); refits start from the full fit's distinct
solutions (up to ``RESAMPLE_STARTS``). When the seeds have at most ``n_boot`` distinct resamples (multisets:
126 for 5 seeds) every one is refitted and weighted by its probability, the exact bootstrap distribution, so an
interval's edge carries no Monte Carlo error; otherwise ``n_boot`` random resamples with a fixed RNG seed.
Intervals are *expanded* percentile intervals of the refits (``_tail_probability``: a plain percentile
interval from 5 seeds runs narrow). The simulation test in ``tests/test_scaling.py`` measures their coverage,
and shows that resampling points instead of seeds misses the interpolated loss more often.

**Does the curve describe the points?** Each fit is checked against the points it was fitted to: its miss of
each budget's mean loss, in units of that mean's seed standard error, against a t limit (Bonferroni over the
budgets); a fit that fails says so first, and what it derives is then not a result. A floor E fitted to 0 (a
pure power law) is said too.

**What is derived.** For a pair of interfaces A, B: the fitted gap L_A(D) − L_B(D) at any budget; its change
per doubling of D at the largest budget, ln 2 · d(gap)/d(ln D); and the budget to parity, the first D at or
above the smallest budget where the fitted curves cross, searched up to a horizon (default 1e12 tokens): with
an interval where the resamples cross, or "no crossing before the horizon" with the share of resamples that
cross before it.

**Refusals.** A fit needs at least 5 budgets spanning at least 16×, and at least 3 seeds that have a run at
every budget for every interface (the paired design); short data raise a ValueError that says what is short.

**The backtest, always.** Every fit is repeated without the largest budget; it predicts the largest budget's
mean loss (and each pair's gap), and the result reports the error with its interval, from the same resamples
on both sides (the refit's prediction minus the resample's observed mean, so the observed mean's own seed noise
counts); the check passes when that interval includes 0. So the extrapolation has been checked over one step,
largest / second-largest budget; every prediction says how far beyond the largest budget it reaches. The
backtest fits one budget fewer than the design needs (4 budgets for the smallest design): it is a check of the
fit, not a fit to report.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from tablefree import stats
from tablefree.units import human

HUBER_DELTA = 1e-3
MIN_BUDGETS = 5
MIN_SPAN = 16.0
MIN_SEEDS = 3
DEFAULT_BOOTSTRAP = 2000
DEFAULT_HORIZON = 1e12
SCREEN_ITERATIONS = 25  # every start of the grid gets this many L-BFGS steps ...
SURVIVORS = 12  # ... and the best this many continue to convergence
RESAMPLE_STARTS = 3  # the full fit's best and two runner-up solutions seed every resample's refit
_GRID_POINTS = 400  # log-spaced points for curves, the parity search and the figures
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


# ------------------------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = E + B·x^(−beta), fitted by the Huber loss on log L; ``objective`` is that loss / δ at the fit."""

    E: float
    B: float
    beta: float
    objective: float

    def predict(self, x: float | np.ndarray) -> np.ndarray:
        return np.exp(_log_curve(_theta(self)[None], np.log(np.asarray(x, dtype=np.float64)).ravel()))[0]


def fit_power_law(
    x: Sequence[float], losses: Sequence[float], weights: Sequence[float] | None = None
) -> PowerLaw:
    """The robust fit of L(x) = E + B·x^(−beta) to points (x_i, loss_i) (every seed's point at every budget):
    Huber (δ = 1e-3) on log loss, L-BFGS from a grid of starting points, the best. ``weights`` multiply each
    point's loss term (1 each when None)."""
    log_x, log_y = _log_points(x, losses)
    w = np.ones(log_x.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != log_x.shape or (w < 0).any() or not np.isfinite(w).all():
        raise ValueError(f"weights: expected {log_x.size} non-negative values")
    if np.unique(log_x[w > 0]).size < 3:
        raise ValueError("a power law with an offset needs points at 3 or more distinct x")
    theta, objective, _ = _fit_from_grid(log_x, log_y, w[None])
    return _power_law(theta[0], objective[0])


def _fit_from_grid(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray) -> tuple:
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


def _refit(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray, starts: np.ndarray) -> np.ndarray:
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


def _log_curve(theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """(R, G) log L at log x for rows of theta = (e, b, beta)."""
    return np.logaddexp(theta[:, 0:1], theta[:, 1:2] - theta[:, 2:3] * log_x[None, :])


def _theta(fit: PowerLaw) -> np.ndarray:
    return np.array([math.log(fit.E), math.log(fit.B), fit.beta])


def _power_law(theta: np.ndarray, objective: float) -> PowerLaw:
    return PowerLaw(float(math.exp(theta[0])), float(np.exp(theta[1])), float(theta[2]), float(objective))


# ------------------------------------------------------------------------------------------------------------
# The design: which budgets and seeds a fit rests on, or why it is refused


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


def check_design(observations: Sequence[Observation], x_name: str = "tokens") -> Design:
    """The paired design of a set of observations that share everything but ``x_name`` (tokens, or params),
    or a ValueError naming what is short: fewer than 5 budgets, a span under 16×, fewer than 3 seeds with a
    run at every budget for every interface (saying which runs are missing)."""
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
    if len(xs) < MIN_BUDGETS:
        raise ValueError(
            f"a fit needs {MIN_BUDGETS} or more {what}, got {len(xs)} ({', '.join(map(human, xs))})"
        )
    span = xs[-1] / xs[0]
    if span < MIN_SPAN:
        raise ValueError(
            f"a fit needs {what} spanning {MIN_SPAN:g}× or more, got {stats.fmt(span)}× "
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
            f"a fit needs {MIN_SEEDS} or more seeds with a run at every one of the {len(xs)} {what} for every "
            f"interface ({', '.join(values)}), got {len(complete)}"
            + (f" ({', '.join(map(str, complete))})" if complete else "")
            + (f"; {'; '.join(missing)}" if missing else "")
        )
    loss = {
        name: np.array([[per_seed[seed][x] for x in xs] for seed in complete])
        for name, per_seed in values.items()
    }
    return Design(x_name, np.array(xs, dtype=np.float64), complete, loss, missing)


# ------------------------------------------------------------------------------------------------------------
# Fits with seed-resampled intervals, derived quantities, the backtest


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
    draws = _resamples(np.random.default_rng(seed), n_seeds, n_x, n_boot, resample)
    weights, probs = draws.weights, draws.probs
    held_out = design.x[-1]
    fit_x = design.x[:-1]
    grid = np.geomspace(design.x[0], max(horizon, held_out), _GRID_POINTS)
    requested = sorted({float(x) for x in predict_at} | {float(held_out)})
    units = n_seeds if resample == "seeds" else n_seeds * n_x
    level = _tail_probability(confidence, units) if expand else (1 - confidence) / 2
    fits, back = {}, {}
    for name in names:
        fits[name] = _fit_with_resamples(design.x, design.loss[name], weights)
        keep = np.tile(np.arange(n_x) < n_x - 1, n_seeds)
        back[name] = _fit_with_resamples(fit_x, design.loss[name][:, :-1], weights[:, keep])
    out_interfaces = {}
    for name in names:
        theta, boot = fits[name]
        rows = np.vstack([theta[None], boot])
        curve = np.exp(_log_curve(rows, np.log(grid)))
        at = np.exp(_log_curve(rows, np.log(requested)))
        out_interfaces[name] = {
            "fit": _fit_dict(theta, boot, level, probs),
            "adequacy": _adequacy(theta, design.x, design.loss[name], confidence),
            "predictions": [
                {"x": x, "reach": x / held_out, **_interval(at[1:, i], at[0, i], level, probs)}
                for i, x in enumerate(requested)
            ],
            "curve": {"x": grid.tolist(), **_band(curve, level, probs)},
            "mean_loss": design.loss[name].mean(axis=0).tolist(),
            "backtest": _backtest(
                float(_curve_at(back[name][0][None], held_out)[0]),
                _curve_at(back[name][1], held_out),
                design.loss[name][:, -1],
                held_out,
                draws,
                level,
            ),
        }
    out_pairs = [
        _pair(a, b, fits, back, design, grid, requested, horizon, level, confidence, draws) for a, b in pairs
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
        "tail_probability": level,
        "interfaces": out_interfaces,
        "pairs": out_pairs,
    }
    result["describes_points"] = all(i["adequacy"]["describes_points"] for i in out_interfaces.values())
    result["sentences"] = [
        s for name, i in out_interfaces.items() for s in _adequacy_sentences(name, i["adequacy"], design)
    ] + [s for p in out_pairs for s in p["sentences"]]
    return _strict(result)


@dataclass(frozen=True)
class _Draws:
    """The resamples of one analysis: ``weights`` (R, seeds·budgets) multiply each point's loss term (seed-major,
    like ``loss.ravel()``), ``probs`` (R,) the probability of each resample."""

    weights: np.ndarray
    probs: np.ndarray
    description: str


def _resamples(rng: np.random.Generator, n_seeds: int, n_x: int, n_boot: int, resample: str) -> _Draws:
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
        return _Draws(
            np.repeat(counts, n_x, axis=1),
            np.exp(log_probs),
            f"all {len(counts)} multisets of {n_seeds} seeds drawn with replacement, each with its probability",
        )
    units = n_seeds if resample == "seeds" else n_seeds * n_x
    draws = rng.integers(0, units, size=(n_boot, units))
    counts = np.stack([np.bincount(d, minlength=units) for d in draws]).astype(np.float64)
    weights = np.repeat(counts, n_x, axis=1) if resample == "seeds" else counts
    what = "seeds" if resample == "seeds" else "points"
    return _Draws(weights, np.full(n_boot, 1.0 / n_boot), f"{n_boot} random resamples of the {what}")


def _quantile(values: np.ndarray, q: float, probs: np.ndarray) -> np.ndarray:
    """The q-quantile (inverted CDF) along axis 0 of ``values`` (R,) or (R, G), row r with probability
    ``probs[r]``."""
    flat = np.asarray(values, dtype=np.float64).reshape(len(probs), -1)
    order = np.argsort(flat, axis=0, kind="stable")
    cumulative = np.cumsum(probs[order], axis=0)
    first = np.argmax(cumulative >= q * cumulative[-1] * (1 - 1e-12), axis=0)
    picked = np.take_along_axis(flat, np.take_along_axis(order, first[None], axis=0), axis=0)[0]
    return picked.reshape(np.shape(values)[1:])


def _interval(values: np.ndarray, estimate: float, level: float, probs: np.ndarray) -> dict:
    return {
        "estimate": float(estimate),
        "low": float(_quantile(values, level, probs)),
        "high": float(_quantile(values, 1 - level, probs)),
    }


def _band(curves: np.ndarray, level: float, probs: np.ndarray) -> dict:
    """Row 0 the full fit's curve, rows 1.. the resamples'."""
    return {
        "estimate": curves[0].tolist(),
        "low": _quantile(curves[1:], level, probs).tolist(),
        "high": _quantile(curves[1:], 1 - level, probs).tolist(),
    }


def _adequacy(theta: np.ndarray, x: np.ndarray, loss: np.ndarray, confidence: float) -> dict:
    """Does the fitted curve pass through the points it was fitted to? Per budget, the full fit's miss of the
    mean loss over seeds in units of that mean's seed standard error; the curve describes the points when
    every miss is within the two-sided t limit at ``confidence``, Bonferroni over the budgets. Also whether the
    floor E went to 0 (the fit is then a pure power law). The check is lenient by design: the standard error
    keeps the seeds' shared offsets (which a curve followed by the median seed does not remove), and with 3
    seeds the limit is 9.9×; it catches a curve of the wrong shape, not a small misfit. (Judging the misses
    against each seed's shape alone flagged one in five true power laws of the simulation.)"""
    n_seeds = loss.shape[0]
    fitted = np.exp(_log_curve(theta[None], np.log(x)))[0]
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
        "floor_at_zero": bool(math.exp(theta[0]) < 1e-3 * float(mean.min())),
    }


def _tail_probability(confidence: float, units: int) -> float:
    """The lower percentile of an expanded percentile interval (Hesterberg 2015, "What teachers should know
    about the bootstrap"): Φ(−√(n/(n−1))·t(1 − α/2, n − 1)) for n resampled units. A plain percentile interval
    from n = 5 seeds has the width of a z interval on a variance shrunk by (n − 1)/n, and covers about 85% for
    a nominal 95%; the expansion restores the t interval's width."""
    alpha = 1 - confidence
    z = math.sqrt(units / (units - 1)) * stats.student_t_ppf(1 - alpha / 2, units - 1)
    return NormalDist().cdf(-z)


def _fit_with_resamples(
    x: np.ndarray, loss: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The full fit (grid of starts) and the (R, 3) resample refits of one interface; ``loss`` (seeds, x)."""
    log_x = np.log(np.tile(x, loss.shape[0]))
    log_y = np.log(loss.ravel())
    theta, _, starts = _fit_from_grid(log_x, log_y, np.ones((1, log_x.size)))
    return theta[0], _refit(log_x, log_y, weights, starts)


def _fit_dict(theta: np.ndarray, boot: np.ndarray, level: float, probs: np.ndarray) -> dict:
    return {
        "E": _interval(np.exp(boot[:, 0]), np.exp(theta[0]), level, probs),
        "B": _interval(np.exp(boot[:, 1]), np.exp(theta[1]), level, probs),
        "beta": _interval(boot[:, 2], theta[2], level, probs),
    }


def _backtest(
    predicted: float,
    predicted_boot: np.ndarray,
    per_seed: np.ndarray,
    held_out: float,
    draws: _Draws,
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
    prediction = _interval(predicted_boot, predicted, level, draws.probs)
    error = _interval(predicted_boot[drawn] - observed_boot, predicted - observed, level, draws.probs[drawn])
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


def _curve_at(theta: np.ndarray, x: float) -> np.ndarray:
    """(R,) values at x of the curves of theta rows (R, 3)."""
    return np.exp(_log_curve(theta, np.log([x])))[:, 0]


def _pair(a, b, fits, back, design, grid, requested, horizon, level, confidence, draws: _Draws) -> dict:
    (theta_a, boot_a), (theta_b, boot_b) = fits[a], fits[b]
    rows_a, rows_b = np.vstack([theta_a[None], boot_a]), np.vstack([theta_b[None], boot_b])
    largest = float(design.x[-1])
    probs = draws.probs

    def gap_at(x: np.ndarray, ta: np.ndarray, tb: np.ndarray) -> np.ndarray:
        log_x = np.log(x)
        return np.exp(_log_curve(ta, log_x)) - np.exp(_log_curve(tb, log_x))

    gaps = gap_at(np.array(requested), rows_a, rows_b)
    gap_at_list = [
        {**_interval(gaps[1:, i], gaps[0, i], level, probs), "x": x, "reach": x / largest}
        for i, x in enumerate(requested)
    ]
    slopes = math.log(2) * (_dlog_slope(rows_a, largest) - _dlog_slope(rows_b, largest))
    change = {**_interval(slopes[1:], slopes[0], level, probs), "at": largest}
    observed_gap = (design.loss[a] - design.loss[b]).mean(axis=0)
    parity = _parity(rows_a, rows_b, float(design.x[0]), horizon, level, probs)
    (bt_a, bt_boot_a), (bt_b, bt_boot_b) = back[a], back[b]
    bt = gap_at(np.array([largest]), np.vstack([bt_a[None], bt_boot_a]), np.vstack([bt_b[None], bt_boot_b]))
    per_seed = (design.loss[a] - design.loss[b])[:, -1]
    backtest = {
        **_backtest(float(bt[0, 0]), bt[1:, 0], per_seed, largest, draws, level),
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
        "gap_curve": {"x": grid.tolist(), **_band(gap_at(grid, rows_a, rows_b), level, probs)},
    }
    result["sentences"] = _pair_sentences(result, design, confidence)
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
            return np.exp(_log_curve(rows_a, log_x)) - np.exp(_log_curve(rows_b, log_x))
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
    q_low, q_high = _quantile(at[1:], level, probs), _quantile(at[1:], 1 - level, probs)
    return {
        **reach,
        "estimate": float(at[0]),
        "low": float(q_low) if math.isfinite(q_low) else None,
        "high": float(q_high) if math.isfinite(q_high) else None,
        "reason": None
        if math.isfinite(q_high)
        else f"over {100 * (1 - share):.0f}% of resamples do not cross before {human(horizon)}",
    }


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
    bounds = f"{level} [{_num(change.low)}, {_num(change.high)}], " if change.low is not None else ""
    sentence = (
        f"From {human(low)} to {human(high)} tokens (separate runs, paired by seed) the measured {a} − {b} gap "
        f"moved from {_num(gap_low)} by {change.estimate:+.3g} nats/token ({bounds}{n} seed{'s' if n > 1 else ''}): "
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


def scaling_report(
    observations: Sequence[Observation],
    pairs: Sequence[tuple[str, str]] | None = None,
    predict_at: Sequence[float] = (),
    horizon: float = DEFAULT_HORIZON,
    params_horizon: float = DEFAULT_HORIZON,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = stats.DEFAULT_SEED,
    confidence: float = 0.95,
) -> dict:
    """Everything, as strict-JSON-ready data: per model size the fit against tokens (``analyse``), and where
    the runs have several sizes, per tokens-per-parameter ratio the fit against parameters; a design too short
    for a fit is recorded with the reason (``refused``) instead. ``predict_at`` are token budgets to predict
    the gaps at (the largest budget run always is one). Per model size, ``measured`` holds how each pair's
    measured gap moved between consecutive budgets (``measured_changes``: no fit, also where the fit is
    refused). ``sentences`` collects those, then every fit's sentences and refusals."""
    kwargs = {"pairs": pairs, "n_boot": n_boot, "seed": seed, "confidence": confidence}
    sizes = sorted({o.params for o in observations}, key=lambda p: (p is not None, p or 0.0))
    by_tokens = []
    sentences = []
    for size in sizes:
        group = [o for o in observations if o.params == size]
        label = f"{human(size)} parameters: " if len(sizes) > 1 and size is not None else ""
        present = {o.interface for o in group}
        here = None if pairs is None else [p for p in pairs if set(p) <= present]
        measured = measured_changes(group, pairs=here, confidence=confidence)
        measured["sentences"] = [label + s for s in measured["sentences"]]
        sentences.extend(measured["sentences"])
        entry = _try(
            label,
            sentences,
            lambda group=group: analyse(
                group, x_name="tokens", predict_at=predict_at, horizon=horizon, **kwargs
            ),
            "fit against tokens",
        )
        by_tokens.append({"params": size, **entry, "measured": measured})
    by_params = []
    params_reason = None
    if len(sizes) < 2 or None in sizes:
        params_reason = (
            "the runs have one model size" if len(sizes) < 2 else "some runs give no parameter count"
        )
    else:
        for ratio, group in groups_by_tokens_per_param(observations):
            label = f"{stats.fmt(ratio)} tokens per parameter: "
            entry = _try(
                label,
                sentences,
                lambda group=group: analyse(group, x_name="params", horizon=params_horizon, **kwargs),
                "fit against parameters",
            )
            by_params.append({"tokens_per_param": ratio, **entry})
    return _strict(
        {
            "method": (
                f"L = E + B·x^(−β) per interface, Huber (δ = {HUBER_DELTA:g}) on log loss, L-BFGS from a grid "
                f"of starts; {100 * confidence:g}% expanded percentile intervals over resamples of seeds (the same "
                f"draw for every interface: every multiset with its probability where there are at most {n_boot}, "
                f"else {n_boot} random draws, RNG seed {seed}); each fit checked against its points; backtest "
                "without the largest budget"
            ),
            # what this call was given besides the observations: `scaling_report(observations, **arguments)`
            # recomputes the whole report from its shipped observations, bit for bit
            "arguments": {
                "pairs": None if pairs is None else [list(pair) for pair in pairs],
                "predict_at": [float(x) for x in predict_at],
                "horizon": float(horizon),
                "params_horizon": float(params_horizon),
                "n_boot": n_boot,
                "seed": seed,
                "confidence": confidence,
            },
            "tokens": by_tokens,
            "params": by_params,
            "params_reason": params_reason,
            "sentences": sentences,
        }
    )


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


def _try(label: str, sentences: list[str], fit, what: str) -> dict:
    try:
        result = fit()
    except ValueError as error:
        sentences.append(f"{label}{'n' if label else 'N'}o {what}: {error}.")
        return {"refused": str(error)}
    sentences.extend(label + s for s in result["sentences"])
    return {"refused": None, **result}


# ------------------------------------------------------------------------------------------------------------
# Sentences


def _adequacy_sentences(name: str, adequacy: dict, design: Design) -> list[str]:
    unit = "tokens" if design.x_name == "tokens" else "parameters"
    sentences = []
    if not adequacy["describes_points"]:
        sentences.append(
            f"The fitted curve of {name} misses its mean loss at {human(adequacy['worst_at'])} {unit} by "
            f"{adequacy['worst_miss']:+.3g} nats/token, {stats.fmt(adequacy['worst_ratio'], 2)}× that mean's "
            f"seed standard error (the limit is {stats.fmt(adequacy['limit'], 2)}×): L = E + B·x^(−β) does not "
            "describe these points, so what the fits derive below (gaps, slopes, crossings) is not a result."
        )
    if adequacy["floor_at_zero"]:
        sentences.append(
            f"The fitted floor E of {name} went to 0: its curve is a pure power law, with no irreducible loss."
        )
    return sentences


def _pair_sentences(pair: dict, design: Design, confidence: float) -> list[str]:
    a, b = pair["a"], pair["b"]
    unit = "tokens" if design.x_name == "tokens" else "parameters"
    level = f"{100 * confidence:g}% CI"
    largest = pair["backtest"]["at"]
    sentences = []
    for g in pair["gap_at"]:
        leader, trailer = (a, b) if g["estimate"] < 0 else (b, a)
        sign = -1.0 if g["estimate"] < 0 else 1.0
        low, high = sorted((sign * g["low"], sign * g["high"]))
        where = (
            "the largest budget run"
            if g["reach"] == 1
            else f"{_ratio(g['reach'])} beyond the largest budget run"
            if g["reach"] > 1
            else "inside the budgets run"
        )
        includes = "; the interval includes 0" if low <= 0 <= high else ""
        sentences.append(
            f"At {human(g['x'])} {unit} ({where}) the fitted curves put {leader} ahead of {trailer} by "
            f"{_num(abs(g['estimate']))} nats/token ({level} [{_num(low)}, {_num(high)}]{includes})."
        )
    c = pair["change_per_doubling"]
    gap_now = next(g for g in pair["gap_at"] if g["x"] == largest)["estimate"]
    gap_sign = 1.0 if gap_now >= 0 else -1.0
    magnitude = gap_sign * c["estimate"]
    verb, orient = ("shrinks", -gap_sign) if magnitude < 0 else ("grows", gap_sign)
    m_low, m_high = sorted((orient * c["low"], orient * c["high"]))  # in units of the verb: shrink or growth
    sentences.append(
        f"At {human(largest)} {unit} the fitted gap {verb} by {_num(abs(magnitude))} nats/token per "
        f"doubling ({level} [{_num(m_low)}, {_num(m_high)}]"
        + ("; the interval includes 0)." if m_low <= 0 <= m_high else ").")
    )
    p = pair["parity"]
    if p["estimate"] is None:
        sentences.append(
            f"The fits do not cross before {human(p['horizon'])} {unit}; "
            f"{100 * p['share_crossing']:.0f}% of the seed resamples cross before it."
        )
    else:
        bounds = (
            f"[{human(p['low']) if p['low'] is not None else '–'}, "
            f"{human(p['high']) if p['high'] is not None else 'beyond ' + human(p['horizon'])}]"
        )
        reach = p["estimate"] / largest
        where = (
            f"{_ratio(reach)} beyond the largest budget run"
            if reach > 1
            else "inside the budgets run, where the measured gaps at each budget say more than the fits"
        )
        sentences.append(
            f"The fits cross at {human(p['estimate'])} {unit} ({level} {bounds}), {where}; "
            f"{100 * p['share_crossing']:.0f}% of the seed resamples cross before {human(p['horizon'])}."
        )
    bt = pair["backtest"]
    checked = _ratio(bt["at"] / bt["fitted_up_to"])
    verdict = (
        f"the error's interval includes 0, so the extrapolation has been checked over {checked}"
        if bt["covered"]
        else f"the error's interval excludes 0, so the extrapolation failed its check over {checked} and "
        "the fits' predictions beyond the budgets run are not results"
    )
    sentences.append(
        f"The backtest (fitted up to {human(bt['fitted_up_to'])}) predicted a gap of {_num(bt['predicted'])} "
        f"at {human(bt['at'])} ({level} [{_num(bt['low'])}, {_num(bt['high'])}]), observed "
        f"{_num(bt['observed'])}: off by {_num(bt['error'])} nats/token ({level} of the error, the observed "
        f"mean's seed noise included: [{_num(bt['error_low'])}, {_num(bt['error_high'])}]); {verdict}"
        + (
            f"; the prediction at {human(pair['gap_at'][-1]['x'])} reaches {_ratio(pair['gap_at'][-1]['reach'])} "
            "beyond the largest budget run, beyond what was checked."
            if bt["covered"] and pair["gap_at"][-1]["reach"] > bt["at"] / bt["fitted_up_to"]
            else "."
        )
    )
    return sentences


def _num(value: float) -> str:
    """Three significant digits; scientific notation only for magnitudes below 1e-4 (a backtest error of 3e-12)."""
    return f"{value:.2g}" if value != 0 and abs(value) < 1e-4 else stats.fmt(value)


def _ratio(value: float) -> str:
    return f"{stats.fmt(value, 2) if value < 100 else f'{value:,.0f}'}×"


# ------------------------------------------------------------------------------------------------------------
# Helpers


def _positive(value: object, where: str, field: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{where}: field {field!r} must be a positive finite number, got {value!r}")
    return float(value)


def _log_points(x: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xs = np.asarray(x, dtype=np.float64).ravel()
    ys = np.asarray(losses, dtype=np.float64).ravel()
    if xs.shape != ys.shape or xs.size == 0:
        raise ValueError(f"expected one loss per x, got {xs.size} x and {ys.size} losses")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all() and (xs > 0).all() and (ys > 0).all()):
        raise ValueError("x and losses must be positive and finite")
    return np.log(xs), np.log(ys)


def _strict(value: object) -> object:
    """Floats that are not finite become None: the result is strict JSON."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
