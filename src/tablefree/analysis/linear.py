"""Closed-form linear tools shared by the probes and the embedding measures: ridge regression from streamed
rows, and linear CKA. Everything is computed in float64 and is deterministic."""

from __future__ import annotations

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


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Linear centred kernel alignment of two representations of the same n items, x (n, d1) and y (n, d2):
    ‖YᵀX‖²_F / (‖XᵀX‖_F · ‖YᵀY‖_F) after centring each column (Kornblith et al., 2019).

    1 for representations equal up to rotation and isotropic scaling, 0 for unrelated ones; invariant to
    orthogonal maps and scale, not to arbitrary invertible linear maps. None when either has no variance."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same items in both: {x.shape[0]} rows against {y.shape[0]}")
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    y = y.to(torch.float64) - y.to(torch.float64).mean(0)
    # d×d products: cheap for many items with few dimensions (V ≫ d)
    cross = (y.T @ x).pow(2).sum()
    norm = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    if float(norm) == 0.0:
        return None
    return float(cross / norm)
