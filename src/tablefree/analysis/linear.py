"""Closed-form linear tools shared by the probes and the embedding measures: ridge regression from streamed
rows, and linear CKA (debiased) with its permutation null. Everything is computed in float64 and is deterministic."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class RidgeModel:
    """y ≈ intercept + ((x − mean) / scale) · weights, fitted on standardised features."""

    mean: torch.Tensor  # (d,)
    scale: torch.Tensor  # (d,)
    weights: torch.Tensor  # (d, k)
    intercept: torch.Tensor  # (k,)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        return self.intercept + ((x - self.mean) / self.scale) @ self.weights


class RidgeAccumulator:
    """Sufficient statistics (n, Σx, Σy, XᵀX, XᵀY) of a ridge regression, accumulated batch by batch, so that
    probing millions of positions needs O(d²) memory, not O(n·d)."""

    def __init__(self, features: int, targets: int) -> None:
        self.n = 0
        self.sum_x = torch.zeros(features, dtype=torch.float64)
        self.sum_y = torch.zeros(targets, dtype=torch.float64)
        self.xtx = torch.zeros(features, features, dtype=torch.float64)
        self.xty = torch.zeros(features, targets, dtype=torch.float64)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Rows x (n, d) with targets y (n, k)."""
        x, y = x.detach().cpu().to(torch.float64), y.detach().cpu().to(torch.float64)
        self.n += x.shape[0]
        self.sum_x += x.sum(0)
        self.sum_y += y.sum(0)
        self.xtx += x.T @ x
        self.xty += x.T @ y

    def solve(self, ridge: float) -> RidgeModel:
        """Ridge on standardised features: weights = (R + ridge·I)⁻¹ c, R the features' correlation matrix
        (unit diagonal) and c their covariance with the targets over the features' scales, so ``ridge`` is
        relative to the data's own scale (ridge·n in sum-of-squares units). A constant feature (a zeroed
        state) gets weight 0, so a state that carries nothing predicts the fit set's mean."""
        if not ridge > 0:
            raise ValueError(f"ridge must be > 0, got {ridge}")
        if self.n < 2:
            raise ValueError(f"a ridge fit needs at least 2 rows, got {self.n}")
        n = self.n
        mean_x, mean_y = self.sum_x / n, self.sum_y / n
        covariance = self.xtx / n - torch.outer(mean_x, mean_x)
        variance = covariance.diagonal().clamp_min(0)
        # relative threshold: float rounding leaves tiny variances on features that are really constant
        constant = variance <= 1e-12 * max(float(variance.max()), 1e-300)
        scale = torch.where(constant, torch.ones_like(variance), variance.sqrt())
        gram = covariance / torch.outer(scale, scale)
        gram[constant, :] = 0
        gram[:, constant] = 0
        cross = (self.xty / n - torch.outer(mean_x, mean_y)) / scale.unsqueeze(1)
        cross[constant] = 0
        system = gram + ridge * torch.eye(len(scale), dtype=torch.float64)
        weights = torch.linalg.solve(system, cross)
        return RidgeModel(mean_x, scale, weights, mean_y)


def fit_ridge(x: torch.Tensor, y: torch.Tensor, ridge: float) -> RidgeModel:
    """Ridge regression of y (n,) or (n, k) on x (n, d); see :meth:`RidgeAccumulator.solve`."""
    y2 = y.reshape(len(y), -1)
    accumulator = RidgeAccumulator(x.shape[1], y2.shape[1])
    accumulator.add(x, y2)
    return accumulator.solve(ridge)


def linear_cka(x: torch.Tensor, y: torch.Tensor, debiased: bool = True) -> float | None:
    """Linear centred kernel alignment of two representations of the same n items, x (n, d1) and y (n, d2).

    Debiased (the default): HSIC_u(K, L) / √(HSIC_u(K, K)·HSIC_u(L, L)) with K = XXᵀ, L = YYᵀ and the unbiased
    HSIC estimator (Song et al. 2012; Nguyen et al. 2021), so that unrelated representations score about 0 at
    any n and d (the biased estimator gives them a floor of about d/n: 0.03 at n = 4,000, d = 128). With
    ``debiased=False``: ‖YᵀX‖²_F / (‖XᵀX‖_F · ‖YᵀY‖_F) (Kornblith et al., 2019). 1 for representations equal
    up to rotation and isotropic scaling; invariant to orthogonal maps and scale, not to arbitrary invertible
    linear maps. None when either has no variance (or the debiased value is undefined, n < 4)."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same items in both: {x.shape[0]} rows against {y.shape[0]}")
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    y = y.to(torch.float64) - y.to(torch.float64).mean(0)
    if not debiased:
        # d×d products: cheap for many items with few dimensions (V ≫ d)
        cross = (y.T @ x).pow(2).sum()
        norm = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
        return None if float(norm) == 0.0 else float(cross / norm)
    if x.shape[0] < 4:
        return None
    xy, xx, yy = _unbiased_hsic(x, y), _unbiased_hsic(x, x), _unbiased_hsic(y, y)
    if xx <= 0 or yy <= 0:
        return None
    return xy / math.sqrt(xx * yy)


def _unbiased_hsic(x: torch.Tensor, y: torch.Tensor) -> float:
    """The unbiased HSIC of the linear kernels K = XXᵀ, L = YYᵀ, up to the common factor 1/(n(n − 3)), from d×d
    and n-vector products only (no n×n matrix): with K̃, L̃ the kernels with zeroed diagonals,
    tr(K̃L̃) + 1ᵀK̃1·1ᵀL̃1/((n − 1)(n − 2)) − 2·1ᵀK̃L̃1/(n − 2)."""
    n = x.shape[0]
    kx, ky = x.pow(2).sum(1), y.pow(2).sum(1)  # the kernels' diagonals
    trace = float((y.T @ x).pow(2).sum() - (kx * ky).sum())
    row_x = x @ x.sum(0) - kx  # K̃1
    row_y = y @ y.sum(0) - ky
    total_x, total_y = float(row_x.sum()), float(row_y.sum())
    return trace + total_x * total_y / ((n - 1) * (n - 2)) - 2 * float(row_x @ row_y) / (n - 2)


def cka_null(x: torch.Tensor, y: torch.Tensor, permutations: int = 50, seed: int = 0) -> float | None:
    """The 95th percentile of the debiased ``linear_cka(x, y[shuffled rows])`` over ``permutations`` fixed
    shuffles: the value unrelated items would reach; a CKA at or below it says nothing. None when undefined."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same items in both: {x.shape[0]} rows against {y.shape[0]}")
    if x.shape[0] < 4:
        return None
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    y = y.to(torch.float64) - y.to(torch.float64).mean(0)
    xx, yy = _unbiased_hsic(x, x), _unbiased_hsic(y, y)  # a shuffle of rows leaves both unchanged
    if xx <= 0 or yy <= 0:
        return None
    generator = torch.Generator().manual_seed(seed)
    values = [
        _unbiased_hsic(x, y[torch.randperm(y.shape[0], generator=generator)]) / math.sqrt(xx * yy)
        for _ in range(permutations)
    ]
    return float(torch.tensor(values).quantile(0.95))
