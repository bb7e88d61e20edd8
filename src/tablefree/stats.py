"""Statistics for comparing input interfaces across seeds and benchmark examples. Pure functions of arrays.

Two kinds of confidence interval for a difference "interface A minus interface B":

* **Per-example metrics** (benchmark accuracy): ``paired_bootstrap_diff``. The scores form one matrix per
  interface, rows = seeds, columns = benchmark examples (the same examples in the same order for every seed and
  interface). Each of ``n_boot`` replicates

  1. draws N example indices with replacement, *the same indices for both interfaces* (paired: an example that
     is hard for one model is usually hard for the other, and pairing cancels that shared difficulty);
  2. draws seeds with replacement, independently within each interface (S_A of A's seeds, S_B of B's);
  3. computes mean(A over its drawn seeds × drawn examples) − mean(B over its drawn seeds × drawn examples).

  The 95% interval is the 2.5th and 97.5th percentile of the replicates (percentile bootstrap); the point
  estimate is the plain difference of the full means. The RNG seed is fixed (default 0), so a report is
  reproducible to the digit. Seeds are resampled independently rather than paired across interfaces: a seed
  fixes the backbone initialisation and data order, but the runs diverge once the inputs differ, so we do not
  assume a shared seed effect (the conservative choice). With one seed per interface step 2 is a no-op and the
  interval reflects example sampling only; with few seeds, seed resampling understates the seed variance
  (a bootstrap over S values has variance (S−1)/S of the sample's), so read such intervals as optimistic.

* **Per-run metrics** (validation loss, perplexity, bits per byte), which have one number per seed:
  ``welch_diff``, a Welch t-interval from seed variation alone. With 2–3 seeds per interface its degrees of
  freedom are small and the interval is wide; with one seed there is no variance estimate and no interval.

``decide`` turns a difference and its interval into the report's sentence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_BOOTSTRAP = 10_000
DEFAULT_SEED = 0
_CHUNK_CELLS = 4_000_000  # replicates × examples per chunk of resampling counts (bounds memory at ~32 MB)


@dataclass(frozen=True)
class Difference:
    """``estimate`` = mean(A) − mean(B) with a confidence interval; ``low``/``high`` are None when undefined."""

    estimate: float
    low: float | None
    high: float | None
    method: str
    confidence: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def as_dict(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value)."""
    array = _finite_1d(values, "values")
    std = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return float(array.mean()), std


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample std / mean (ddof=1), e.g. the seed-to-seed variation of validation perplexity (0.048 = 4.8%)."""
    mean, std = mean_std(values)
    if mean == 0:
        raise ValueError("coefficient of variation is undefined for a zero mean")
    return std / abs(mean)


def paired_bootstrap_diff(
    scores_a: np.ndarray,
    scores_b: np.ndarray,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Difference:
    """Percentile-bootstrap CI of mean(A) − mean(B) over seeds and paired examples (see the module docstring).

    ``scores_a`` has shape (seeds_A, examples), ``scores_b`` (seeds_B, examples); column j of both is example j.
    """
    a, b = _score_matrix(scores_a, "scores_a"), _score_matrix(scores_b, "scores_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"paired bootstrap needs the same examples: A has {a.shape[1]}, B has {b.shape[1]}")
    rng = np.random.default_rng(seed)
    n_examples = a.shape[1]
    replicates = np.empty(n_boot)
    chunk = max(1, _CHUNK_CELLS // n_examples)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        example_weights = _resample_weights(rng, size, n_examples)  # (size, N), rows sum to 1
        mean_a = _seed_resampled_mean(rng, example_weights @ a.T)  # (size,)
        mean_b = _seed_resampled_mean(rng, example_weights @ b.T)
        replicates[start : start + size] = mean_a - mean_b
    low, high = _percentiles(replicates, confidence)
    estimate = float(a.mean() - b.mean())
    return Difference(estimate, low, high, f"paired bootstrap ({n_boot} replicates, seed {seed})", confidence)


def welch_diff(values_a: Sequence[float], values_b: Sequence[float], confidence: float = 0.95) -> Difference:
    """Welch t-interval of mean(A) − mean(B) from per-seed values; no interval when a side has one seed."""
    a, b = _finite_1d(values_a, "values_a"), _finite_1d(values_b, "values_b")
    estimate = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Difference(estimate, None, None, "Welch t-interval (needs ≥2 seeds per interface)", confidence)
    var_a, var_b = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(var_a + var_b)
    if se == 0:
        return Difference(estimate, estimate, estimate, "Welch t-interval (no seed variation)", confidence)
    df = (var_a + var_b) ** 2 / (var_a**2 / (a.size - 1) + var_b**2 / (b.size - 1))
    half = student_t_ppf(0.5 + confidence / 2, df) * se
    return Difference(
        estimate, estimate - half, estimate + half, f"Welch t-interval (df={df:.1f})", confidence
    )


def decide(
    difference: Difference, name_a: str, name_b: str, metric: str, higher_is_better: bool, digits: int = 4
) -> str:
    """The plain sentence for one comparison of A vs B on ``metric``.

    "resolved: canonical better than learned by 0.0123 acc (higher is better; 95% CI [0.0041, 0.0205])" when the interval excludes 0, the
    amount and interval oriented so that positive means "the winner is better"; otherwise "not resolved at this
    scale: ..." with the raw difference and its interval (or the reason there is none).
    """
    d = difference
    level = f"{100 * d.confidence:g}% CI"
    if d.low is None or d.high is None:
        return (
            f"not resolved at this scale: {name_a} − {name_b} = {d.estimate:+.{digits}f} {metric} "
            f"(no {level}: needs at least two seeds per interface)"
        )
    if not d.excludes_zero:
        return (
            f"not resolved at this scale: {name_a} − {name_b} = {d.estimate:+.{digits}f} {metric} "
            f"({level} [{d.low:+.{digits}f}, {d.high:+.{digits}f}] includes 0)"
        )
    a_wins = d.low > 0 if higher_is_better else d.high < 0
    # Orient as "winner minus loser", in the direction where larger means better for the winner.
    sign = 1.0 if a_wins == higher_is_better else -1.0
    low, high = sorted((sign * d.low, sign * d.high))
    winner, loser = (name_a, name_b) if a_wins else (name_b, name_a)
    direction = "higher" if higher_is_better else "lower"
    return (
        f"resolved: {winner} better than {loser} by {sign * d.estimate:.{digits}f} {metric} "
        f"({direction} is better; {level} [{low:.{digits}f}, {high:.{digits}f}])"
    )


# ----------------------------------------------------------------------------------------------------------
# Student t quantile (no SciPy dependency): regularized incomplete beta by continued fraction, then bisection.


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
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if student_t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


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


def _resample_weights(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """(size, n) resampling weights: row r counts how often each of n items was drawn in n draws, over n."""
    draws = rng.integers(0, n, size=(size, n))
    flat = (draws + np.arange(size)[:, None] * n).ravel()
    return np.bincount(flat, minlength=size * n).reshape(size, n) / n


def _seed_resampled_mean(rng: np.random.Generator, per_seed: np.ndarray) -> np.ndarray:
    """Per replicate: the mean over seeds drawn with replacement of ``per_seed`` (size, seeds)."""
    return (per_seed * _resample_weights(rng, per_seed.shape[0], per_seed.shape[1])).sum(axis=1)


def _percentiles(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def _score_matrix(scores: np.ndarray, name: str) -> np.ndarray:
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty (seeds, examples) matrix, got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError(f"{name}: scores must be finite")
    return matrix


def _finite_1d(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError(f"{name}: no values")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: values must be finite, got {array.tolist()}")
    return array
