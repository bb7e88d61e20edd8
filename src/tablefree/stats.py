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
  and recomputes D̄; the variance of the replicates, corrected for its small-sample bias, is v_eval, with
  (effective number of clusters) − 1 degrees of freedom (``variance_components``).

**The interval is the wider of two.** (1) The paired t on the seeds alone, D̄ ± t(0.975, S − 1)·√v_seed; (2) the
combined D̄ ± t(0.975, ν)·√(v_seed + v_eval), ν from Welch–Satterthwaite. The p-value is the larger of the two
tests' p-values (an intersection–union test: resolved only when both reject), so interval and p-value always
agree. Why both: the combined interval alone is *narrower than the seed-only t* whenever the seed part
dominates (the evaluation set's N − 1 degrees of freedom shrink the t multiplier faster than its variance
grows the standard error), and in simulation it then covers 93% with 3 seeds; the seed-only t alone ignores the
evaluation set and covers 40–60% when documents dominate. The wider of the two covers at least 94% in every case
of the simulation grid in ``tests/test_stats.py`` (document-, seed- and interaction-dominated sweeps,
heavy-tailed t(3) seed effects, skewed lognormal document effects, S = 3 and 5; docs/experiments.md gives the
numbers), and false "resolved" under no difference stays at 5% within the simulation's error. Its price: the
seed × document interaction enters both parts, so where it dominates the interval is wide (99% coverage). A
two-way random-effects estimate of the variance components would not count it twice, but it can fall below
the seed-only variance and needs a Satterthwaite df with a negative term; we chose the simple bound.

With one seed there is no estimate of the seed variation and no interval; with two, the interval is shown but
nothing is called resolved (one degree of freedom for the seed variation: in simulation such intervals cover
less than 95%). The RNG seed is fixed (default 0): a report is reproducible to the digit.

Validation loss is a ratio (nats over tokens), so each document enters as its sum of nats and its token count;
benchmark examples enter with weight 1 each. Perplexity and bits per byte are fixed transformations of the
validation loss on the same split: they are reported, but they are not separate tests.

**Several pairs.** The pairs of interfaces are tested together: ``holm`` adjusts their p-values (Holm's
step-down method, family-wise error 5%), and a comparison is resolved only when its adjusted p-value is below
0.05. The comparison at Holm's step k of m is tested at level 0.05/(m − k + 1); the interval at that level
(``Difference.interval_at``) is the one consistent with Holm's decision, and the sentence prints it.

**Chance.** A benchmark on which neither interface is distinguishable from its chance level (``paired_difference``
of each interface against the per-example chance score, e.g. 1/4 for a four-way choice) gets no verdict: "at
chance (N examples)".

**Power.** ``Difference.detectable`` is the smallest true difference this design would resolve with 80%
probability at a given Holm step: (t(1 − α/(2(m − k + 1)), ν) + t(0.80, ν))·se, for the wider of the two tests.
It is a power figure, not evidence about the true difference: it rests on the *estimated* standard error, which
with few seeds is itself uncertain (with ν = 2 the true se lies between 0.52× and 6.3× the estimate with 95%
confidence), and ``detectable`` returns that range too. Only the interval says which differences the data
rule out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
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

    ``se``/``df`` are the combined test's (seeds + evaluation set, Welch–Satterthwaite df), ``seed_se`` the
    seed-only paired t's (on ``seeds`` − 1 df; None when only the evaluation set entered: one seed against
    chance). ``low``/``high`` are the wider of the two intervals and ``p_value`` the larger p-value (module
    docstring). All are None when undefined (one seed). ``seeds`` paired seeds, ``clusters`` documents or
    examples (0 when only per-run numbers were available)."""

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
    seed_se: float | None = None
    seed_df: float | None = None  # the seed-only test's df where it is not seeds − 1 (a contrast of groups)

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def tests(self) -> list[tuple[float, float]]:
        """(se, df) of each test the interval is the wider of: the combined one, then the seed-only t."""
        found = [(self.se, self.df)] if self.se is not None and self.df is not None else []
        seed_df = float(self.seeds - 1) if self.seed_df is None else self.seed_df
        if self.seed_se is not None and self.seeds > 1 and (self.seed_se, seed_df) not in found:
            found.append((self.seed_se, seed_df))
        return found

    def interval_at(self, confidence: float) -> tuple[float, float] | None:
        """The interval at another level (e.g. 1 − 0.05/3 at Holm's first step of 3): the wider of the tests'."""
        tests = self.tests()
        if not tests:
            return None
        half = max(student_t_ppf(0.5 + confidence / 2, df) * se for se, df in tests)
        return self.estimate - half, self.estimate + half

    def detectable(self, family: int = 1, step: int = 1, alpha: float = ALPHA) -> dict[str, float] | None:
        """The smallest true difference resolved with 80% probability at Holm's ``step`` of ``family`` (level
        alpha/(family − step + 1)), and its 95% range from the uncertainty of the estimated se: ``value``,
        ``low``, ``high``, ``df`` (of the test that sets it). None without an se. A power figure: it rules
        nothing out (the interval does)."""
        tests = self.tests()
        if not tests:
            return None
        level = alpha / max(1, family - step + 1)
        value, df = max(
            ((student_t_ppf(1 - level / 2, df) + student_t_ppf(POWER, df)) * se, df) for se, df in tests
        )
        return {
            "value": value,
            "low": value * math.sqrt(df / chi2_ppf(0.975, df)),
            "high": value * math.sqrt(df / chi2_ppf(0.025, df)),
            "df": df,
            "family": family,
            "step": step,
        }

    def as_dict(self) -> dict:
        record = {**asdict(self), "excludes_zero": self.excludes_zero}
        if self.seed_df is None:
            del record["seed_df"]  # the usual seeds − 1: report.json keeps its old fields
        return record


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
    if seeds < 2 and not (one_seed_interval and n_boot and clusters > 1):
        estimate = float(((a - b).sum(axis=1) / w.sum()).mean())
        return Difference(
            estimate, None, None, "one seed: no estimate of the seed variation", seeds, clusters
        )
    estimate, v_seed, v_eval, df_eval = (float(x[0]) for x in variance_components(a - b, w, n_boot, seed))
    method = (
        f"wider of the paired t on the seeds ({seeds - 1} df) and the seeds + a cluster bootstrap over "
        f"{clusters} documents/examples ({n_boot} replicates, seed {seed}; Welch–Satterthwaite df)"
        if n_boot and clusters > 1
        else f"paired by seed (t, {seeds - 1} df); evaluation-set sampling not included"
    )
    if seeds < 2:
        method = f"one seed: cluster bootstrap over {clusters} documents/examples only ({n_boot} replicates)"
    return _interval(estimate, v_seed, seeds, v_eval, df_eval, method, confidence, clusters)


def variance_components(
    differences: np.ndarray, weights: np.ndarray, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = DEFAULT_SEED
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, v_seed, v_eval, df_eval) of one sweep, ``differences`` (seeds, clusters) of summed A − B per
    cluster with ``weights`` (clusters,), or of a batch of sweeps, (sweeps, seeds, clusters) with (sweeps,
    clusters) weights (the simulation test runs thousands at once; the batch shares the bootstrap's draws).
    Arrays of one value per sweep. v_eval is 0 with ``n_boot`` 0 or one cluster; v_seed 0 with one seed.

    The bootstrap variance of a weighted mean of N clusters is biased low: by (N − 1)/N with equal weights, by
    (Σw² − 2Σw³/W + (Σw²)²/W²)/Σw² (W = Σw) in general, for exchangeable cluster effects; it is divided by that
    factor. Its degrees of freedom are the effective number of clusters minus one, W²/Σw² − 1 (Kish; N − 1
    with equal weights): a few long documents carry most of the tokens."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[None] if d.ndim == 2 else d
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), (d.shape[0], d.shape[2]))
    sweeps, seeds, clusters = d.shape
    total = w.sum(axis=1)
    per_seed = d.sum(axis=2) / total[:, None]
    estimate = per_seed.mean(axis=1)
    v_seed = per_seed.var(axis=1, ddof=1) / seeds if seeds > 1 else np.zeros(sweeps)
    v_eval, df_eval = np.zeros(sweeps), np.zeros(sweeps)
    if n_boot and clusters > 1:
        replicates = _cluster_bootstrap(d.mean(axis=1), w, n_boot, seed)
        squares, cubes = (w**2).sum(axis=1), (w**3).sum(axis=1)
        bias = (squares - 2 * cubes / total + squares**2 / total**2) / squares
        v_eval = replicates.var(axis=0, ddof=1) / bias
        df_eval = total**2 / squares - 1
    return estimate, v_seed, v_eval, df_eval


def contrast_difference(
    differences: Sequence[np.ndarray],
    weights: np.ndarray,
    coefficients: Sequence[float],
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Difference:
    """A contrast Σ_g c_g·D̄_g of paired differences measured in separate groups of seeds (the rungs of a model
    ladder: each group its own runs) on one evaluation set: ``differences[g]`` is (seeds_g, clusters) of summed
    A − B per cluster, ``weights`` (clusters,) the units per cluster, shared by every group. With c = (−1, 1) it
    is the change of the gap from one group to the next; with least-squares weights on x_g, the slope of the gap
    against x.

    The same design as ``paired_difference``, with the seed part unpaired across groups: v_seed = Σ c_g²·s_g²/S_g
    with Welch–Satterthwaite df over the groups; v_eval from one cluster bootstrap of the contrast's per-cluster
    sums (the same documents in every group, so their shared sampling error cancels where the groups agree). The
    interval is the wider of the seed-only t and the combined t, as everywhere."""
    groups = [_matrix(d, f"differences[{g}]") for g, d in enumerate(differences)]
    c = _finite_1d(coefficients, "coefficients")
    if len(groups) != c.size or len(groups) < 2:
        raise ValueError(
            f"a contrast needs ≥2 groups and one coefficient each: {len(groups)} groups, {c.size}"
        )
    clusters = groups[0].shape[1]
    w = _finite_1d(weights, "weights")
    if any(g.shape[1] != clusters for g in groups) or w.shape != (clusters,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"every group needs the same {clusters} clusters and non-negative weights for them")
    seeds = [g.shape[0] for g in groups]
    if min(seeds) < 2:
        raise ValueError(f"a contrast needs ≥2 seeds in every group (the seed variation), got {seeds}")
    per_seed = [g.sum(axis=1) / w.sum() for g in groups]
    estimate = float(sum(cg * p.mean() for cg, p in zip(c, per_seed, strict=True)))
    parts = np.array([cg**2 * p.var(ddof=1) / p.size for cg, p in zip(c, per_seed, strict=True)])
    v_seed = float(parts.sum())
    seed_df = (
        float(v_seed**2 / sum(part**2 / (p.size - 1) for part, p in zip(parts, per_seed, strict=True)))
        if v_seed
        else 1.0
    )
    v_eval, df_eval = 0.0, 0.0
    if n_boot and clusters > 1:
        contrast = sum(cg * g.mean(axis=0) for cg, g in zip(c, groups, strict=True))[None]
        v_eval, df_eval = (float(x[0]) for x in variance_components(contrast[None], w, n_boot, seed)[2:])
    se = math.sqrt(v_seed + v_eval)
    method = (
        f"wider of the Welch t on the seeds of {len(groups)} separate groups ({'/'.join(map(str, seeds))} seeds, "
        f"{seed_df:.1f} df) and the seeds + a cluster bootstrap over {clusters} documents ({n_boot} replicates, "
        f"seed {seed}; Welch–Satterthwaite df)"
    )
    if se == 0:
        raise ValueError("a contrast with no variation at all (every seed and document agrees): no interval")
    df = float(welch_satterthwaite(v_seed, seed_df, v_eval, df_eval if v_eval > 0 else 0))
    provisional = Difference(
        estimate,
        None,
        None,
        method,
        sum(seeds),
        clusters,
        se=se,
        df=df,
        confidence=confidence,
        seed_se=math.sqrt(v_seed),
        seed_df=seed_df,
    )
    low, high = provisional.interval_at(confidence)  # type: ignore[misc]
    p = max(two_sided_p(estimate / s, d) if s > 0 else 0.0 for s, d in provisional.tests())
    return replace(provisional, low=low, high=high, p_value=p)


def least_squares_weights(x: Sequence[float]) -> np.ndarray:
    """c with Σ c_g·y_g the least-squares slope of y against x (one y per x): (x − x̄)/Σ(x − x̄)²."""
    values = _finite_1d(x, "x")
    centered = values - values.mean()
    if values.size < 2 or not (centered @ centered) > 0:
        raise ValueError(f"a slope needs ≥2 distinct x values, got {values.tolist()}")
    return centered / (centered @ centered)


def welch_satterthwaite(
    v_seed: np.ndarray, df_seed: float, v_eval: np.ndarray, df_eval: np.ndarray
) -> np.ndarray:
    """Degrees of freedom of the sum of two variance estimates (a part with 0 df contributes nothing)."""
    seed_part = np.square(v_seed) / df_seed if df_seed > 0 else 0.0
    eval_part = np.where(np.asarray(df_eval) > 0, np.square(v_eval) / np.maximum(df_eval, 1e-300), 0.0)
    return np.square(np.add(v_seed, v_eval)) / np.add(seed_part, eval_part)


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


def fmt_p(p: float) -> str:
    """A p-value: two significant digits, scientific below 0.001 (1.8e-05, not 0.000018)."""
    return f"{p:.2g}" if 0 < p < 1e-3 else fmt(p, 2)


def holm_steps(p_values: Sequence[float | None]) -> list[int | None]:
    """Each p-value's step in Holm's procedure (1 = the smallest, tested at alpha/m); None entries: None."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    steps: list[int | None] = [None] * len(p_values)
    for rank, (_, index) in enumerate(order):
        steps[index] = rank + 1
    return steps


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
    step: int = 1,
) -> str:
    """The plain sentence for one comparison of A with B, always stated as A − B with its sign.

    ``unit`` names the metric ("nats/token", "acc"); ``scale`` says what each run was and what it was scored on
    ("2.5M tokens each; 31 documents, 640k tokens"). ``adjusted_p`` is the Holm-adjusted p-value among ``family``
    pairs and ``step`` this comparison's step in Holm's procedure; the comparison is resolved when the adjusted
    p-value is below ``alpha`` (without one, when the interval excludes 0). In a family the sentence also gives
    the interval at the step's level, the one consistent with Holm's decision.
    """
    d = difference
    level = f"{100 * d.confidence:g}% CI"
    seeds = f"{d.seeds} seed" + ("s" if d.seeds != 1 else "")
    amount = f"{name_a} − {name_b} = {fmt(d.estimate)} {unit}"
    if d.low is None or d.high is None:
        return (
            f"not resolved with {seeds}: {amount}; one seed gives no estimate of the seed-to-seed variation "
            f"(run 3 or more seeds) [{scale}]"
        )
    interval = f"{level} [{fmt(d.low)}, {fmt(d.high)}]"
    if d.seeds < MIN_SEEDS_TO_RESOLVE:
        return (
            f"not resolved with {seeds}: {amount} ({interval}); two seeds leave one degree of freedom for the "
            f"seed-to-seed variation, too few to resolve anything: run 3 or more seeds [{scale}]"
        )
    p = adjusted_p if adjusted_p is not None else d.p_value
    resolved = p is not None and p < alpha if adjusted_p is not None else d.excludes_zero
    holm_part = ""
    if family > 1 and p is not None:
        step_level = 1 - alpha / max(1, family - step + 1)
        bounds = d.interval_at(step_level)
        holm_part = f"Holm over {family} pairs: adjusted p = {fmt_p(p)}"
        if bounds is not None:
            holm_part += (
                f"; at its step {step}, {100 * step_level:.3g}% CI [{fmt(bounds[0])}, {fmt(bounds[1])}]"
            )
    if resolved:
        a_wins = (d.estimate > 0) == higher_is_better
        winner = name_a if a_wins else name_b
        extra = f"; {holm_part}" if holm_part else ""
        return f"resolved, {winner} better: {amount} ({interval}; paired over {seeds}; {scale}{extra})"
    if d.excludes_zero and holm_part:
        why = f"; the {level} excludes 0, but Holm's correction decides: {holm_part}"
    else:
        why = f"; {holm_part}" if holm_part else ""
    power = d.detectable(family, step, alpha)
    tail = ""
    if power is not None and power["value"] > 0:
        tail = (
            f"; power: a true difference of about {fmt(power['value'], 2)} would be resolved with 80% "
            f"probability (95% range {fmt(power['low'], 2)}–{fmt(power['high'], 2)}: the standard error rests "
            f"on {fmt(power['df'], 2)} degrees of freedom)"
        )
    return f"not resolved with {seeds} at {scale}: {amount} ({interval}{why}){tail}"


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


def _interval(
    estimate: float,
    v_seed: float,
    seeds: int,
    v_eval: float,
    df_eval: float,
    method: str,
    confidence: float,
    clusters: int,
) -> Difference:
    """The wider of the seed-only t (S − 1 df) and the combined t (Welch–Satterthwaite df), the larger p."""
    se = math.sqrt(v_seed + v_eval)
    seed_se = math.sqrt(v_seed) if seeds > 1 else None
    if se == 0:
        p = 1.0 if estimate == 0 else 0.0
        df = float(max(seeds - 1, df_eval, 1))
        return Difference(
            estimate, estimate, estimate, method, seeds, clusters, 0.0, df, p, confidence, seed_se
        )
    df = float(welch_satterthwaite(v_seed, seeds - 1, v_eval, df_eval if v_eval > 0 else 0))
    provisional = Difference(estimate, None, None, method, seeds, clusters, se, df, None, confidence, seed_se)
    low, high = provisional.interval_at(confidence)  # type: ignore[misc]
    p = max(two_sided_p(estimate / s, d) if s > 0 else 0.0 for s, d in provisional.tests())
    return replace(provisional, low=low, high=high, p_value=p)


def two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom."""
    return max(0.0, 2 * (1 - student_t_cdf(abs(t), df)))


def chi2_ppf(p: float, df: float) -> float:
    """Quantile of the chi-square distribution (bisection on the regularized lower incomplete gamma)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"chi2_ppf needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    low, high = 0.0, max(1.0, 2.0 * df)
    while _gammainc(df / 2, high / 2) < p:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if _gammainc(df / 2, middle / 2) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def _gammainc(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) (Numerical Recipes: a series below a + 1, else a continued
    fraction by Lentz's method)."""
    if x <= 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(log_front)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return 1.0 - math.exp(log_front) * h


def _cluster_bootstrap(sums: np.ndarray, weights: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, rows) replicates of each row's sum(sums)/sum(weights), ``sums`` and ``weights`` (rows,
    clusters), the same clusters drawn with replacement for every row."""
    rng = np.random.default_rng(seed)
    n = sums.shape[1]
    replicates = np.empty((n_boot, sums.shape[0]))
    chunk = max(1, _CHUNK_CELLS // n)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        counts = _resample_counts(rng, size, n)
        replicates[start : start + size] = (counts @ sums.T) / (counts @ weights.T)
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
