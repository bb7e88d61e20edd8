"""``gaussian``: a frozen random table, N(0, σ²) per entry, generated on the fly from (seed, id) by a
counter-based generator: no V×d buffer and no trainable parameter. *Does structure matter, or only distinctness?*

Entry (t, j) is a function of (seed, t, j) alone: a 32-bit integer hash (Wellons' ``lowbias32``, computed in
int64 without overflow) of the id keyed by the seed, mixed with the hash of 2j and 2j+1, gives two uniforms,
and Box–Muller turns them into a standard normal, times σ. Any id's row can be computed alone, on any device, in
any batch: the same (seed, t) always gives the same row (bit-identical on one device type; float32 rounding of
log/cos may differ in the last bit between CPU and GPU).

σ defaults to 1/√2, so that E‖x‖² = d/2: the mean squared row norm of the {0, 1} codes (half the bits set, on
average, so ‖x‖² ≈ d/2). With ``values: pm1`` codes (‖x‖² = d) in mind, set ``sigma: 1.0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tablefree.interfaces.base import InputInterface, check_token_ids, register_interface
from tablefree.interfaces.options import MAX_INPUT_SCALE, InterfaceConfig, OptionError, input_scale_error

MASK32 = 0xFFFF_FFFF
DEFAULT_SIGMA = 1 / math.sqrt(2)


@dataclass
class GaussianOptions(InterfaceConfig):
    name: str = "gaussian"
    sigma: float | None = (
        None  # standard deviation of each entry; None (default): 1/√2 (the {0,1} codes' norm)
    )
    seed: int | None = None  # seed of the table; None (default): the training seed

    def __post_init__(self) -> None:
        if self.sigma is not None and not 0 < self.sigma <= MAX_INPUT_SCALE:  # NaN fails too
            raise OptionError("sigma", input_scale_error(self.sigma))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2³² for 0 <= x, c < 2³², in int64 without overflow (x split into 16-bit halves)."""
    return ((x & 0xFFFF) * c + (((x >> 16) * c) & 0xFFFF) * 65536) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32 on int64 tensors holding values in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """24 random bits -> a float in (0, 1), never 0 (so its log is finite)."""
    return ((bits >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def gaussian_rows(ids: torch.Tensor, d_model: int, seed: int) -> torch.Tensor:
    """Standard-normal rows (ids.shape + (d,)), a pure function of (seed, id, column)."""
    key = int(hash32(torch.tensor([seed & MASK32], dtype=torch.int64))[0])
    row = hash32((ids.to(torch.int64) ^ key) & MASK32).unsqueeze(-1)
    columns = torch.arange(d_model, device=ids.device, dtype=torch.int64)
    first, second = hash32(2 * columns), hash32(2 * columns + 1)
    radius = torch.sqrt(-2.0 * torch.log(_uniform(hash32(row ^ first))))
    angle = (2 * math.pi) * _uniform(hash32(row ^ second))
    return radius * torch.cos(angle)


@register_interface("gaussian")
class GaussianTable(InputInterface):
    """A frozen random N(0, σ²) table, computed from (seed, id); nothing stored."""

    Options = GaussianOptions

    @property
    def sigma(self) -> float:
        return DEFAULT_SIGMA if self.options.sigma is None else self.options.sigma

    @property
    def seed(self) -> int:
        return 0 if self.options.seed is None else self.options.seed  # build_model resolves None first

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        rows = gaussian_rows(ids, self.d_model, self.seed) * self.sigma
        return rows.to(torch.get_default_dtype())

    def describe(self) -> str:
        return (
            f"Row t is a frozen random vector: each of its {self.d_model} entries N(0, σ²) with σ = {self.sigma:.6g}, "
            f"generated from (seed {self.options.seed}, t, column) by a counter-based hash (lowbias32) and "
            "Box–Muller; σ is chosen so that E‖x‖² = d·σ² matches the {0, 1} codes' d/2."
        )
