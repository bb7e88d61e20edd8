"""Statistics for comparing input interfaces across seeds and evaluation sets. Pure functions of arrays.

**The design.** Runs with the same seed share the backbone initialisation and the batch order, so the seed effect
is largely shared across interfaces; and every run is scored on the same evaluation set. So the comparison of
interface A with interface B is *paired by seed*, and the evaluation set's own sampling error is shared by both
interfaces and every seed.

**The primary comparison** (``paired_difference``). Per seed s, the difference D_s = metric(A, s) − metric(B, s)
on the same evaluation set. Its mean D̄ has two sources of error:

* seeds: the per-seed differences vary; their variance over S seeds gives v_seed = s²(D)/S, with S − 1 degrees
  of freedom (a t interval on the per-seed differences);
* the evaluation set: the documents (validation) or examples (benchmarks) are a sample too. A *cluster*
  bootstrap resamples whole documents (never tokens or windows: tokens of one document are correlated, and
  token-level errors understate the error several-fold), the same documents for both interfaces and every seed,
  and recomputes D̄; the variance of the replicates is v_eval, with N − 1 degrees of freedom for N clusters.

The interval is D̄ ± t(0.975, ν)·√(v_seed + v_eval), with ν from Welch–Satterthwaite. The seed × document
interaction (a document that favours A under one seed and B under another) shows in both components, so the
interval errs on the wide side when that interaction is large; the simulation test in ``tests/test_stats.py``
checks that 95% intervals cover the truth 93–97% of the time and that "resolved" under no difference stays at
or below 5%. With one seed there is no estimate of the seed variation and no interval; with two, the interval is shown but
nothing is called resolved (one degree of freedom for the seed variation: in simulation such intervals cover
less than 95%). The RNG seed is fixed
(default 0): a report is reproducible to the digit.

Validation loss is a ratio (nats over tokens), so each document enters as its sum of nats and its token count;
benchmark examples enter with weight 1 each. Perplexity and bits per byte are fixed transformations of the
validation loss on the same split: they are reported, but they are not separate tests.

**Several pairs.** The pairs of interfaces are tested together: ``holm`` adjusts their p-values (Holm's
step-down method, family-wise error 5%), and a comparison is resolved only when its adjusted p-value is below
0.05.

**Chance.** A benchmark on which neither interface is distinguishable from its chance level (``paired_difference``
of each interface against the per-example chance score, e.g. 1/4 for a four-way choice) gets no verdict: "at
chance (N examples)".

**Power.** ``Difference.detectable`` is the smallest true difference this design would resolve with 80%
probability, (t(0.975, ν) + t(0.80, ν))·se: what a "not resolved" can rule out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

DEFAULT_BOOTSTRAP = 10_000
DEFAULT_SEED = 0
ALPHA = 0.05
MIN_SEEDS_TO_RESOLVE = (
    3  # with 2 seeds the seed variance rests on one degree of freedom: intervals run narrow
)
POWER = 0.80
_CHUNK_CELLS = 4_000_000  # replicates × clusters per chunk of resampling counts (bounds memory at ~32 MB)


@dataclass(frozen=True)
class Difference:
    """``estimate`` = mean over seeds of metric(A) − metric(B), with its interval and what it rests on.

    ``low``/``high``/``se``/``df``/``p_value`` are None when undefined (one seed). ``seeds`` paired seeds,
    ``clusters`` documents or examples (0 when only per-run numbers were available)."""

    estimate: float
    low: float | None
    high: float | None
    method: str
    seeds: int
    clusters: int = 0
    se: float | None = None
    df: float | None = None
    p_value: float | None = None
    confidence: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    @property
    def detectable(self) -> float | None:
        """The smallest true difference resolved with 80% probability by this design (None without an se)."""
        if self.se is None or self.df is None:
            return None
        alpha = 1 - self.confidence
        return (student_t_ppf(1 - alpha / 2, self.df) + student_t_ppf(POWER, self.df)) * self.se

    def as_dict(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero, "detectable": self.detectable}


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1; None for a single value: one seed has no spread)."""
    array = _finite_1d(values, "values")
    std = float(array.std(ddof=1)) if array.size > 1 else None
    return float(array.mean()), std


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample std / mean (ddof=1), e.g. the seed-to-seed variation of validation perplexity (0.048 = 4.8%)."""
    mean, std = mean_std(values)
    if std is None:
        raise ValueError("coefficient of variation needs at least two values")
    if mean == 0:
        raise ValueError("coefficient of variation is undefined for a zero mean")
    return std / abs(mean)


def paired_difference(
    sums_a: np.ndarray,
    sums_b: np.ndarray,
    weights: np.ndarray | None = None,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
    one_seed_interval: bool = False,
) -> Difference:
    """Paired-by-seed difference of A and B with a seeds × evaluation-set interval (see the module docstring).

    ``sums_a`` and ``sums_b`` have shape (seeds, clusters): row s of both is seed s, column d is document (or
    example) d, holding the metric's sum over the cluster's units (a document's nats; an example's score).
    ``weights`` (clusters,) are the units per cluster (a document's tokens; 1 per example when None). The metric
    of a run is sum over clusters / sum of weights. ``sums_b`` may also be a (clusters,) reference (a chance
    level) shared by every seed. With ``n_boot`` 0, or one cluster, only the seed variation enters. With one
    seed there is no interval, unless ``one_seed_interval`` asks for the evaluation-set part alone (as the test
    against chance does: a single run far above chance is not at chance).
    """
    a = _matrix(sums_a, "sums_a")
    b = np.broadcast_to(np.asarray(sums_b, dtype=np.float64), a.shape) if np.ndim(sums_b) == 1 else sums_b
    b = _matrix(b, "sums_b")
    if a.shape != b.shape:
        raise ValueError(
            f"paired comparison needs the same seeds and documents: A is {a.shape[0]} seeds × {a.shape[1]}, "
            f"B is {b.shape[0]} × {b.shape[1]}"
        )
    seeds, clusters = a.shape
    w = np.ones(clusters) if weights is None else _finite_1d(weights, "weights")
    if w.shape != (clusters,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights: expected {clusters} non-negative values with a positive sum")
    scored = w > 0  # a document with no scored tokens (cut off by a window limit) carries no information
    a, b, w = a[:, scored], b[:, scored], w[scored]
    clusters = int(scored.sum())
    per_seed = (a - b).sum(axis=1) / w.sum()
    estimate = float(per_seed.mean())
    if seeds < 2 and not (one_seed_interval and n_boot and clusters > 1):
        return Difference(
            estimate, None, None, "one seed: no estimate of the seed variation", seeds, clusters
        )
    v_seed = float(per_seed.var(ddof=1)) / seeds if seeds > 1 else 0.0
    v_eval = 0.0
    if n_boot and clusters > 1:
        replicates = _cluster_bootstrap((a - b).mean(axis=0, keepdims=True), w, n_boot, seed)[:, 0]
        # × N/(N − 1): the bootstrap variance of a mean of N clusters is (N − 1)/N of the unbiased estimate
        replicates *= math.sqrt(clusters / (clusters - 1))
        v_eval = float(replicates.var(ddof=1))
    method = (
        f"paired by seed (t, {seeds - 1} df) + cluster bootstrap over {clusters} documents/examples "
        f"({n_boot} replicates, seed {seed})"
        if v_eval > 0 or (n_boot and clusters > 1)
        else f"paired by seed (t, {seeds - 1} df); evaluation-set sampling not included"
    )
    if seeds < 2:
        method = f"one seed: cluster bootstrap over {clusters} documents/examples only ({n_boot} replicates)"
    return _t_interval(estimate, v_seed, seeds - 1, v_eval, clusters - 1, method, seeds, clusters, confidence)


def paired_seed_difference(values_a: Sequence[float], values_b: Sequence[float], confidence: float = 0.95):
    """Paired-by-seed difference from one number per run (element s of both = seed s): the t interval on the
    per-seed differences alone. Used where no per-document data exist (the in-training estimates)."""
    a, b = _finite_1d(values_a, "values_a"), _finite_1d(values_b, "values_b")
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs the same seeds: A has {a.size}, B has {b.size}")
    return paired_difference(a[:, None], b[:, None], n_boot=0, confidence=confidence)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values for one family of tests (None entries are left out of the family)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(indexed)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


def slope_against_log(
    x: Sequence[float], y_per_seed: np.ndarray, confidence: float = 0.95
) -> dict[str, float | int | None]:
    """Least-squares slope of y against ln(x), per seed, and its t interval over seeds.

    ``y_per_seed`` is (seeds, points), e.g. the per-seed gap at each validation point. The slope per seed is
    fitted separately, so the interval (t on S − 1 df) uses the seed-to-seed spread of slopes: a shrinking gap
    has a negative slope when the gap is positive. Units: y per e-fold of x (per ln-unit)."""
    logs = np.log(_finite_1d(x, "x"))
    y = _matrix(y_per_seed, "y_per_seed")
    if y.shape[1] != logs.size or logs.size < 2:
        raise ValueError(f"slope needs ≥2 points and one y per x: {logs.size} x, y is {y.shape}")
    centered = logs - logs.mean()
    slopes = (y - y.mean(axis=1, keepdims=True)) @ centered / (centered @ centered)
    seeds = slopes.size
    estimate = float(slopes.mean())
    if seeds < 2:
        return {"slope": estimate, "low": None, "high": None, "seeds": seeds, "points": int(logs.size)}
    half = student_t_ppf(0.5 + confidence / 2, seeds - 1) * float(slopes.std(ddof=1)) / math.sqrt(seeds)
    return {
        "slope": estimate,
        "low": estimate - half,
        "high": estimate + half,
        "seeds": seeds,
        "points": int(logs.size),
    }


def unigram_cross_entropy(train_counts: np.ndarray, eval_counts: np.ndarray, smoothing: float = 0.5) -> float:
    """Cross-entropy (nats per token) of a unigram model fit on ``train_counts`` (add-``smoothing``) on a set with
    token counts ``eval_counts``: the level a language model must beat before interface differences mean much."""
    train = np.asarray(train_counts, dtype=np.float64)
    evals = np.asarray(eval_counts, dtype=np.float64)
    if train.shape != evals.shape or evals.sum() <= 0:
        raise ValueError("unigram cross-entropy needs two count vectors over the same vocabulary")
    probs = (train + smoothing) / (train.sum() + smoothing * train.size)
    return float(-(evals * np.log(probs)).sum() / evals.sum())


# ----------------------------------------------------------------------------------------------------------
# Sentences


def fmt(value: float, digits: int = 3) -> str:
    """``digits`` significant digits, without scientific notation for ordinary magnitudes (0.0331, 1.25, 312)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def decide(
    difference: Difference,
    name_a: str,
    name_b: str,
    unit: str,
    higher_is_better: bool,
    scale: str,
    adjusted_p: float | None = None,
    family: int = 1,
    alpha: float = ALPHA,
) -> str:
    """The plain sentence for one comparison of A with B.

    ``unit`` names the metric ("nats/token", "acc"); ``scale`` says what each run was and what it was scored on
    ("2.5M tokens each; 31 documents, 640k tokens"). ``adjusted_p`` is the Holm-adjusted p-value among ``family``
    pairs; the comparison is resolved when it is below ``alpha`` (without one, when the interval excludes 0).
    """
    d = difference
    level = f"{100 * d.confidence:g}% CI"
    seeds = f"{d.seeds} seed" + ("s" if d.seeds != 1 else "")
    if d.low is None or d.high is None:
        return (
            f"not resolved with {seeds}: {name_a} − {name_b} = {fmt(d.estimate)} {unit}; one seed gives no "
            f"estimate of the seed-to-seed variation (run 3 or more seeds) [{scale}]"
        )
    p = adjusted_p if adjusted_p is not None else d.p_value
    resolved = p is not None and p < alpha if adjusted_p is not None else d.excludes_zero
    correction = f"Holm-adjusted p = {fmt(p, 2)} over {family} pairs" if family > 1 and p is not None else ""
    if d.seeds < MIN_SEEDS_TO_RESOLVE:
        return (
            f"not resolved with {seeds}: {name_a} − {name_b} = {fmt(d.estimate)} {unit} ({level} "
            f"[{fmt(d.low)}, {fmt(d.high)}]); two seeds leave one degree of freedom for the seed-to-seed "
            f"variation, too few to resolve anything: run 3 or more seeds [{scale}]"
        )
    if not resolved:
        detectable = d.detectable
        tail = (
            f"; the smallest difference this design could detect is about {fmt(detectable, 2)}"
            if detectable
            else ""
        )
        extra = f"; {correction}" if correction else ""
        return (
            f"not resolved with {seeds} at {scale}: {name_a} − {name_b} = {fmt(d.estimate)} {unit} "
            f"({level} [{fmt(d.low)}, {fmt(d.high)}]{extra}){tail}"
        )
    a_wins = (d.estimate > 0) == higher_is_better
    sign = 1.0 if d.estimate > 0 else -1.0
    low, high = sorted((sign * d.low, sign * d.high))
    winner, loser = (name_a, name_b) if a_wins else (name_b, name_a)
    extra = f"; {correction}" if correction else ""
    return (
        f"resolved: {winner} better than {loser} by {fmt(abs(d.estimate))} {unit} "
        f"({level} [{fmt(low)}, {fmt(high)}]; paired over {seeds}; {scale}{extra})"
    )


# ----------------------------------------------------------------------------------------------------------
# Student t (no SciPy dependency): regularized incomplete beta by continued fraction, then bisection.


def student_t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t with (possibly fractional) ``df`` degrees of freedom."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"student_t_ppf needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -student_t_ppf(1 - p, df)
    # Newton's method on the cdf from the Cornish-Fisher start, kept inside a shrinking bracket (bisection when
    # a step leaves it).
    z = NormalDist().inv_cdf(p)
    t = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    low, high = 0.0, max(t, 1.0)
    while student_t_cdf(high, df) < p:
        low, high = high, 2 * high
    t = t if low < t < high else (low + high) / 2
    for _ in range(100):
        error = student_t_cdf(t, df) - p
        if abs(error) < 1e-14:
            break
        if error < 0:
            low = t
        else:
            high = t
        step = t - error / _student_t_pdf(t, df)
        t = step if low < step < high else (low + high) / 2
        if high - low < 1e-13 * max(1.0, high):
            break
    return t


def _student_t_pdf(t: float, df: float) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (Numerical Recipes' continued fraction, Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * result / a


# ----------------------------------------------------------------------------------------------------------


def _t_interval(
    estimate: float,
    v_seed: float,
    df_seed: int,
    v_eval: float,
    df_eval: int,
    method: str,
    seeds: int,
    clusters: int,
    confidence: float,
) -> Difference:
    se = math.sqrt(v_seed + v_eval)
    if se == 0:
        p = 1.0 if estimate == 0 else 0.0
        return Difference(
            estimate,
            estimate,
            estimate,
            method,
            seeds,
            clusters,
            0.0,
            float(max(df_seed, df_eval, 1)),
            p,
            confidence,
        )
    parts = (v_seed**2 / df_seed if df_seed > 0 else 0.0) + (v_eval**2 / df_eval if df_eval > 0 else 0.0)
    df = (v_seed + v_eval) ** 2 / parts
    half = student_t_ppf(0.5 + confidence / 2, df) * se
    p = 2 * (1 - student_t_cdf(abs(estimate) / se, df))
    return Difference(
        estimate, estimate - half, estimate + half, method, seeds, clusters, se, df, max(p, 0.0), confidence
    )


def _cluster_bootstrap(sums: np.ndarray, weights: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, seeds) replicates of each row's sum(sums)/sum(weights), the same clusters drawn with
    replacement for every row."""
    rng = np.random.default_rng(seed)
    n = sums.shape[1]
    replicates = np.empty((n_boot, sums.shape[0]))
    chunk = max(1, _CHUNK_CELLS // n)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        counts = _resample_counts(rng, size, n)
        replicates[start : start + size] = (counts @ sums.T) / (counts @ weights)[:, None]
    return replicates


def _resample_counts(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """(size, n): row r counts how often each of n items was drawn in n draws with replacement."""
    draws = rng.integers(0, n, size=(size, n))
    flat = (draws + np.arange(size)[:, None] * n).ravel()
    return np.bincount(flat, minlength=size * n).reshape(size, n).astype(np.float64)


def _matrix(values: np.ndarray, name: str) -> np.ndarray:
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty (seeds, clusters) matrix, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError(f"{name}: values must be finite")
    return matrix


def _finite_1d(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError(f"{name}: no values")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: values must be finite, got {array.tolist()}")
    return array
