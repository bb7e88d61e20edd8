"""Statistics against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tablefree.stats import (
    Difference,
    coefficient_of_variation,
    decide,
    mean_std,
    paired_bootstrap_diff,
    student_t_ppf,
    welch_diff,
)


def test_mean_std_and_cv_by_hand() -> None:
    # mean 2, deviations -1 0 1, sample variance (1+0+1)/2 = 1
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert mean_std([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError, match="finite"):
        mean_std([1.0, float("nan")])


def test_bootstrap_constant_scores_give_a_point_interval() -> None:
    a = np.full((3, 50), 0.75)
    b = np.full((2, 50), 0.25)
    d = paired_bootstrap_diff(a, b, n_boot=200)
    assert (d.estimate, d.low, d.high) == pytest.approx((0.5, 0.5, 0.5))


def test_bootstrap_two_examples_by_hand() -> None:
    # One seed, A = [1, 0], B = [0, 0]. A replicate draws 2 examples: the mean of A is 0 (prob 1/4),
    # 1/2 (prob 1/2) or 1 (prob 1/4); so the 2.5th and 97.5th percentiles are 0 and 1.
    d = paired_bootstrap_diff(np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]), n_boot=4000)
    assert (d.estimate, d.low, d.high) == pytest.approx((0.5, 0.0, 1.0))


def test_bootstrap_pairs_examples() -> None:
    # A and B score identically on every example: a paired bootstrap sees a difference of exactly 0, whereas
    # resampling each side's examples independently would give a wide interval.
    rng = np.random.default_rng(0)
    shared = (rng.random((1, 400)) < 0.5).astype(float)
    d = paired_bootstrap_diff(shared, shared.copy(), n_boot=500)
    assert (d.low, d.high) == (0.0, 0.0)


def test_bootstrap_resamples_seeds_by_hand() -> None:
    # A's two seeds score 1 and 0 on every example, B scores 0. Only the seed draw matters: A's mean is
    # 1 (prob 1/4), 1/2 (prob 1/2) or 0 (prob 1/4), so the interval is [0, 1] around the estimate 1/2.
    a = np.array([[1.0] * 10, [0.0] * 10])
    b = np.zeros((1, 10))
    d = paired_bootstrap_diff(a, b, n_boot=4000)
    assert (d.estimate, d.low, d.high) == pytest.approx((0.5, 0.0, 1.0))


def test_bootstrap_matches_normal_approximation_on_a_large_sample() -> None:
    # One seed, 20,000 paired examples: the percentile interval should match mean(d) ± 1.96·sd(d)/√n.
    rng = np.random.default_rng(1)
    n = 20_000
    a = (rng.random((1, n)) < 0.55).astype(float)
    b = (rng.random((1, n)) < 0.50).astype(float)
    differences = (a - b)[0]
    half_width = 1.959964 * differences.std(ddof=1) / math.sqrt(n)
    d = paired_bootstrap_diff(a, b, n_boot=4000)
    assert d.estimate == pytest.approx(differences.mean())
    assert d.low == pytest.approx(differences.mean() - half_width, abs=0.1 * half_width)
    assert d.high == pytest.approx(differences.mean() + half_width, abs=0.1 * half_width)


def test_bootstrap_is_reproducible_and_seeded() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.random((2, 100)), rng.random((2, 100))
    assert paired_bootstrap_diff(a, b, n_boot=300) == paired_bootstrap_diff(a, b, n_boot=300)
    assert paired_bootstrap_diff(a, b, n_boot=300, seed=1) != paired_bootstrap_diff(a, b, n_boot=300)


def test_bootstrap_rejects_unpaired_examples() -> None:
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap_diff(np.zeros((1, 3)), np.zeros((1, 4)))


def test_student_t_quantiles_match_tables() -> None:
    # Printed t tables: t_{0.975} for 1, 2, 10 degrees of freedom; the normal 1.959964 in the limit.
    assert student_t_ppf(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert student_t_ppf(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert student_t_ppf(0.975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert student_t_ppf(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    assert student_t_ppf(0.025, 10) == pytest.approx(-2.2281, abs=1e-4)


def test_welch_interval_by_hand() -> None:
    # A = [1, 3]: mean 2, variance 2; B = [0, 2]: mean 1, variance 2.
    # se = sqrt(2/2 + 2/2) = sqrt(2); df = (1 + 1)^2 / (1/1 + 1/1) = 2; half = 4.302653 · sqrt(2).
    d = welch_diff([1.0, 3.0], [0.0, 2.0])
    half = 4.302653 * math.sqrt(2)
    assert (d.estimate, d.low, d.high) == pytest.approx((1.0, 1.0 - half, 1.0 + half), abs=1e-5)
    assert not d.excludes_zero
    one_seed = welch_diff([1.0], [2.0, 3.0])
    assert one_seed.low is None and not one_seed.excludes_zero


def test_decision_sentences_resolved_and_not() -> None:
    resolved_higher = Difference(0.02, 0.01, 0.03, "test")
    assert decide(resolved_higher, "canonical", "learned", "acc", higher_is_better=True) == (
        "resolved: canonical better than learned by 0.0200 acc (higher is better; 95% CI [0.0100, 0.0300])"
    )
    # A − B = +0.08 in perplexity (lower is better): B wins, by 0.08, interval [0.03, 0.13].
    resolved_lower = Difference(0.08, 0.03, 0.13, "test")
    assert decide(resolved_lower, "learned", "affine", "val_ppl", higher_is_better=False, digits=2) == (
        "resolved: affine better than learned by 0.08 val_ppl (lower is better; 95% CI [0.03, 0.13])"
    )
    # A − B = −0.05 in accuracy: B wins by 0.05, interval [0.02, 0.09].
    resolved_b = Difference(-0.05, -0.09, -0.02, "test")
    assert decide(resolved_b, "learned", "affine", "acc", True, digits=2).startswith(
        "resolved: affine better than learned by 0.05 acc (higher is better; 95% CI [0.02, 0.09])"
    )
    unresolved = Difference(0.01, -0.02, 0.04, "test")
    assert decide(unresolved, "canonical", "learned", "acc", True, digits=2) == (
        "not resolved at this scale: canonical − learned = +0.01 acc (95% CI [-0.02, +0.04] includes 0)"
    )
