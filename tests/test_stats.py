"""Statistics against hand-computed cases, and the interval method against simulated sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tablefree.stats import (
    Difference,
    coefficient_of_variation,
    decide,
    fmt,
    holm,
    mean_std,
    paired_difference,
    paired_seed_difference,
    slope_against_log,
    student_t_ppf,
    unigram_cross_entropy,
)


def test_mean_std_and_cv_by_hand() -> None:
    # mean 2, deviations -1 0 1, sample variance (1+0+1)/2 = 1
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert mean_std([5.0]) == (5.0, None)  # one seed has no spread (not "± 0")
    with pytest.raises(ValueError, match="finite"):
        mean_std([1.0, float("nan")])


def test_student_t_quantiles_match_tables() -> None:
    # Printed t tables: t_{0.975} for 1, 2, 10 degrees of freedom; t_{0.80} for 2; the normal 1.959964 in the limit.
    assert student_t_ppf(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert student_t_ppf(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert student_t_ppf(0.975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert student_t_ppf(0.80, 2) == pytest.approx(1.0607, abs=1e-4)
    assert student_t_ppf(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    assert student_t_ppf(0.025, 10) == pytest.approx(-2.2281, abs=1e-4)


def test_paired_by_seed_interval_by_hand() -> None:
    # Per-seed differences 0.3, 0.4, 0.35 (the seed effect 1, 2, 3 is shared and cancels): mean 0.35,
    # sd 0.05, se 0.05/√3; t(0.975, 2) = 4.302653. An unpaired comparison would be swamped by the seed effect.
    a, b = [1.3, 2.4, 3.35], [1.0, 2.0, 3.0]
    d = paired_seed_difference(a, b)
    half = 4.302653 * 0.05 / math.sqrt(3)
    assert (d.estimate, d.low, d.high, d.df, d.seeds) == pytest.approx((0.35, 0.35 - half, 0.35 + half, 2, 3))
    assert d.excludes_zero
    # detectable at 80% power: (t_.975 + t_.80) · se on 2 df
    assert d.detectable == pytest.approx((4.302653 + 1.060660) * 0.05 / math.sqrt(3), rel=1e-5)


def test_one_seed_has_no_interval() -> None:
    d = paired_seed_difference([1.0], [2.0])
    assert d.estimate == -1.0 and d.low is None and d.detectable is None and not d.excludes_zero
    sentence = decide(d, "learned", "canonical", "nats/token", False, "500k tokens each")
    assert sentence.startswith("not resolved with 1 seed") and "run 3 or more seeds" in sentence


def test_document_bootstrap_adds_the_evaluation_set_error() -> None:
    # Every seed has the same per-document differences: no seed variation at all, so the whole interval is
    # the document sampling error. Two documents of 10 tokens, differences of 2 and 0 nats per token: a
    # bootstrap mean is 2 (1/4), 1 (1/2) or 0 (1/4): variance 1/2, × N/(N−1) = 1; se 1 on N − 1 = 1 df.
    sums_a = np.array([[20.0, 0.0]] * 3)
    d = paired_difference(sums_a, np.zeros((3, 2)), weights=np.array([10.0, 10.0]), n_boot=20_000)
    assert d.estimate == pytest.approx(1.0)
    assert d.se == pytest.approx(1.0, rel=0.03) and d.df == pytest.approx(1.0, rel=0.05)
    assert d.low == pytest.approx(1 - 12.706 * d.se, rel=1e-3)


def test_document_bootstrap_resamples_documents_jointly() -> None:
    # A and B share every document's difficulty exactly: resampling the same documents for both gives no
    # document error, however different the documents are.
    rng = np.random.default_rng(0)
    tokens = rng.integers(100, 1000, 40).astype(float)
    difficulty = rng.normal(6, 1, 40) * tokens
    sums_b = np.stack([difficulty + s for s in range(3)])
    sums_a = sums_b + 0.1 * tokens + np.array([[0.0], [0.01], [-0.01]]) * tokens
    d = paired_difference(sums_a, sums_b, weights=tokens, n_boot=500)
    assert d.estimate == pytest.approx(0.1)
    assert d.se == pytest.approx(0.01 / math.sqrt(3), rel=1e-6)  # the seed part only


def test_paired_difference_checks_its_input() -> None:
    with pytest.raises(ValueError, match="same seeds and documents"):
        paired_difference(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="weights"):
        paired_difference(np.zeros((2, 3)), np.zeros((2, 3)), weights=np.ones(2))


def test_chance_reference_is_shared_by_seeds() -> None:
    # Two seeds at exactly 1/4 on every four-way example: indistinguishable from chance.
    scores = np.array([[1, 0, 0, 0] * 25, [0, 1, 0, 0] * 25], dtype=float)
    d = paired_difference(scores, np.full(100, 0.25), n_boot=300)
    assert d.estimate == pytest.approx(0.0) and not d.excludes_zero


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.02, 0.04 → 3·0.01, max(0.03, 2·0.02), max(0.04, 1·0.04)
    assert holm([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_slope_against_log_tokens_by_hand() -> None:
    tokens = [1e5, 1e5 * math.e, 1e5 * math.e**2]
    gaps = np.array([[0.5, 0.4, 0.3], [0.6, 0.4, 0.2]])  # slopes −0.1 and −0.2 per e-fold
    slope = slope_against_log(tokens, gaps)
    half = 12.706205 * (0.1 / math.sqrt(2)) / math.sqrt(2)
    assert slope["slope"] == pytest.approx(-0.15)
    assert (slope["low"], slope["high"]) == pytest.approx((-0.15 - half, -0.15 + half), rel=1e-5)


def test_unigram_cross_entropy_by_hand() -> None:
    # p = (3, 1)/4 without smoothing; eval counts (1, 1): −(ln 3/4 + ln 1/4)/2
    value = unigram_cross_entropy(np.array([3, 1]), np.array([1, 1]), smoothing=0.0)
    assert value == pytest.approx(-(math.log(0.75) + math.log(0.25)) / 2)


def test_sentences() -> None:
    resolved = Difference(-0.33, -0.38, -0.28, "test", seeds=3, clusters=30, se=0.01, df=2.0, p_value=0.001)
    assert decide(resolved, "learned", "canonical", "nats/token", False, "2.5M tokens each") == (
        "resolved: learned better than canonical by 0.330 nats/token (95% CI [0.280, 0.380]; paired over "
        "3 seeds; 2.5M tokens each)"
    )
    # A − B = +0.05 in accuracy (higher is better): A wins; Holm across 3 pairs is stated.
    assert decide(
        resolved.__class__(0.05, 0.02, 0.09, "t", 3, 500, 0.01, 5.0, 0.004),
        "affine",
        "learned",
        "acc",
        True,
        "500 examples",
        adjusted_p=0.012,
        family=3,
    ) == (
        "resolved: affine better than learned by 0.0500 acc (95% CI [0.0200, 0.0900]; paired over 3 seeds; "
        "500 examples; Holm-adjusted p = 0.012 over 3 pairs)"
    )
    unresolved = Difference(-0.04, -0.1, 0.02, "test", seeds=3, clusters=30, se=0.014, df=2.0, p_value=0.1)
    sentence = decide(unresolved, "learned", "canonical", "nats/token", False, "164k tokens each")
    assert sentence.startswith(
        "not resolved with 3 seeds at 164k tokens each: learned − canonical = -0.0400 nats/token "
        "(95% CI [-0.100, 0.0200])"
    )
    assert sentence.endswith(
        f"the smallest difference this design could detect is about {fmt(unresolved.detectable, 2)}"
    )
    assert "scale" not in sentence
    # An interval excluding 0 that Holm's correction does not keep is not resolved, and says why.
    held_back = decide(
        resolved.__class__(0.05, 0.001, 0.09, "t", 3, 500, 0.02, 5.0, 0.04),
        "a",
        "b",
        "acc",
        True,
        "500 examples",
        adjusted_p=0.08,
        family=3,
    )
    assert held_back.startswith("not resolved") and "Holm-adjusted p = 0.080 over 3 pairs" in held_back


def _simulated_sweep(rng: np.random.Generator, seeds: int, truth: float, documents: int = 20):
    """One sweep like the real ones: documents of unequal length and difficulty, a seed effect shared by both
    interfaces (it cancels when paired), a seed-specific and a document-specific part of the difference, and
    per-document noise per run."""
    tokens = rng.lognormal(math.log(20_000), 0.5, documents)
    difficulty = rng.normal(6.0, 0.3, documents)
    shared_seed = rng.normal(0.0, 0.05, seeds)[:, None]
    half_gap = (truth + rng.normal(0.0, 0.1, documents) + rng.normal(0.0, 0.03, seeds)[:, None]) / 2
    loss_a = difficulty + shared_seed + half_gap + rng.normal(0.0, 0.03, (seeds, documents))
    loss_b = difficulty + shared_seed - half_gap + rng.normal(0.0, 0.03, (seeds, documents))
    return loss_a * tokens, loss_b * tokens, tokens


@pytest.mark.parametrize("seeds", [3, 5])
def test_intervals_cover_the_truth_in_simulated_sweeps(seeds: int) -> None:
    rng = np.random.default_rng(seeds)
    covered = false_resolved = 0
    sweeps = 2000
    for sweep in range(sweeps):
        d = paired_difference(*_simulated_sweep(rng, seeds, truth=0.2), n_boot=200, seed=sweep)
        covered += d.low <= 0.2 <= d.high
        null = paired_difference(*_simulated_sweep(rng, seeds, truth=0.0), n_boot=200, seed=sweep)
        false_resolved += null.excludes_zero
    assert 0.93 <= covered / sweeps <= 0.97
    assert false_resolved / sweeps <= 0.05


def test_one_seed_against_chance_uses_the_examples_alone() -> None:
    # One run right on 300 of 400 four-way examples: far above chance 1/4 even without a seed estimate.
    scores = np.array([[1.0] * 300 + [0.0] * 100])
    d = paired_difference(scores, np.full(400, 0.25), n_boot=2000, one_seed_interval=True)
    assert d.estimate == pytest.approx(0.5) and d.excludes_zero and d.seeds == 1
    assert d.se == pytest.approx(math.sqrt(0.75 * 0.25 / 400), rel=0.1)
    assert paired_difference(scores, np.full(400, 0.25), n_boot=2000).low is None  # pairs of interfaces: none


def test_no_variation_at_all_is_a_point_interval() -> None:
    # LAMBADA at this scale: every example 0 for every seed and for chance
    d = paired_difference(np.zeros((1, 50)), np.zeros(50), n_boot=200, one_seed_interval=True)
    assert (d.estimate, d.low, d.high, d.p_value, d.detectable) == (0.0, 0.0, 0.0, 1.0, 0.0)
    assert not d.excludes_zero


def test_two_seeds_never_resolve() -> None:
    d = Difference(-0.33, -0.38, -0.28, "test", seeds=2, clusters=20, se=0.01, df=18.0, p_value=1e-9)
    sentence = decide(d, "learned", "canonical", "nats/token", False, "300k tokens each")
    assert sentence.startswith("not resolved with 2 seeds") and "run 3 or more seeds" in sentence
