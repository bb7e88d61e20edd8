"""A small nonlinear probe: one hidden layer of ReLU units, trained with AdamW on binary targets.

A linear probe cannot read an XOR of bits, and the canonical bits of an ``affine`` model's token are XORs of
the code bits it receives (c = A⁻¹·(c′ ⊕ b) over GF(2)), so "no linear probe finds them" is a statement about
linear readout only. This probe can read such bits (the tests show it reading them from an affine model's input
on token types it never saw, where the linear probe cannot). Seeded: the initialisation and the minibatch order
come from ``settings.seed``, so a fit repeats exactly on the same machine and thread count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MLPProbeSettings:
    """How the MLP probe is built and trained (recorded in analysis.json beside its results)."""

    hidden: int = 256  # ReLU units of the one hidden layer
    steps: int = 2000  # AdamW steps, each on ``batch`` rows drawn with replacement from the fit rows
    batch: int = 256
    lr: float = 1e-2  # peak rate, decayed to 0 on a cosine over the steps
    weight_decay: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "steps", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MLP probe {name} must be a positive integer, got {value!r}")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"MLP probe {name} must be a finite number ≥ 0, got {value!r}")

    def record(self) -> dict[str, Any]:
        return {"activation": "relu", "optimizer": "AdamW", "schedule": "cosine to 0", **asdict(self)}


@dataclass
class MLPModel:
    """logits = W₂·relu(W₁·(x − mean) / scale + b₁) + b₂, fitted on standardised features."""

    mean: torch.Tensor  # (d,)
    scale: torch.Tensor  # (d,)
    network: torch.nn.Sequential

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) rows → (n, k) bool: the bits the probe reads."""
        device = self.mean.device
        return (self.network((x.to(device, torch.float32) - self.mean) / self.scale) >= 0).cpu()


def fit_mlp(
    x: torch.Tensor,
    y: torch.Tensor,
    settings: MLPProbeSettings | None = None,
    device: str | torch.device = "cpu",
) -> MLPModel:
    """Fit the probe to rows x (n, d) with bit targets y (n, k) in {0, 1} (binary cross-entropy per bit, one
    network for all k bits). Features are standardised on the fit rows; a constant feature (a zeroed state)
    becomes 0, so a state that carries nothing leaves the probe only the bits' base rates."""
    settings = settings or MLPProbeSettings()
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"the MLP probe needs one target row per input row: {x.shape[0]} against {y.shape[0]}"
        )
    if x.shape[0] < 2:
        raise ValueError(f"an MLP probe fit needs at least 2 rows, got {x.shape[0]}")
    x = x.to(device, torch.float32)
    y = y.reshape(len(y), -1).to(device, torch.float32)
    mean = x.mean(0)
    variance = x.var(0, unbiased=False)
    # relative threshold, as in the ridge fit: rounding leaves tiny variances on features that are constant
    constant = variance <= 1e-12 * max(float(variance.max()), 1e-30)
    scale = torch.where(constant, torch.ones_like(variance), variance.sqrt())
    x = (x - mean) / scale
    generator = torch.Generator().manual_seed(settings.seed)
    network = _network(x.shape[1], settings.hidden, y.shape[1], generator).to(device)
    optimizer = torch.optim.AdamW(network.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * 0.5 * (1 + math.cos(math.pi * step / settings.steps))
        rows = torch.randint(0, x.shape[0], (settings.batch,), generator=generator).to(device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(network(x[rows]), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return MLPModel(mean, scale, network.eval())


def _network(features: int, hidden: int, outputs: int, generator: torch.Generator) -> torch.nn.Sequential:
    """Linear → ReLU → Linear, initialised from ``generator`` (PyTorch's default ranges, ±1/√fan_in), not
    from the global random state, so that a probe does not depend on what ran before it."""
    network = torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, outputs)
    )
    with torch.no_grad():
        for layer in (network[0], network[2]):
            bound = 1 / math.sqrt(layer.in_features)
            torch.nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
            torch.nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return network
