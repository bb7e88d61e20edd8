"""``separable``: the token id as C mixed-radix digits, each with its own small trainable codebook, combined and
optionally passed through a small generator (Batley & Saha 2026, "A Separable Architecture for Continuous Token
Representation in Language Models"). *What is the cheapest trainable input that does as well as the table?*

Id t is written in base s with C digits, t = Σ_i t_i·s^i (``coordinates`` C, default 2; ``codebook_size`` s,
default the smallest s with s^C ≥ V, ⌈√V⌉ for two). Coordinate i has a trainable codebook E_i; the most
significant coordinate only takes the values 0..⌈V/s^(C−1)⌉−1, so its codebook has that many rows (s for the
default sizes almost always) and no row is a parameter that never trains. The rows E_i[t_i] are combined:

* ``sum`` (default): each E_i is n_i×d and x = (Σ_i E_i[t_i]) / √C;
* ``concat``: each E_i is n_i×w_i and x = [E_0[t_0]; ...; E_{C−1}[t_{C−1}]], the widths w_i splitting d as
  evenly as it goes (the first d mod C coordinates one column wider).

Every codebook starts N(0, init_std) like every matrix of the model, so each input value starts N(0, init_std²)
exactly as a learned table's row does (the 1/√C keeps the sum at that scale). With ``generator_hidden`` h > 0 a
residual MLP follows, as the decoder's blocks are built: x + W₂·GELU(W₁·rms(x)), rms a gain-free RMS norm, W₁
h×d and W₂ d×h, W₂ starting at zero so the input starts as the combined codebooks alone. Parameters:
d·Σn_i (sum) or Σn_i·w_i (concat), plus 2·d·h; all are input-interface parameters, trained without weight
decay unless ``optim.decay_embeddings``, as the learned table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tablefree.interfaces.base import InputInterface, check_token_ids, register_interface
from tablefree.interfaces.options import InterfaceConfig, OptionError, choice

COMBINES = ("sum", "concat")
RMS_EPS = 1e-6  # the generator's norm; the decoder's default norm_eps order


@dataclass
class SeparableOptions(InterfaceConfig):
    name: str = "separable"
    coordinates: int = 2  # C: digits per id
    codebook_size: int | None = None  # s: values per digit; None (default): the smallest s with s^C >= V
    combine: str = "sum"  # sum: n_i×d codebooks added; concat: n_i×(d/C) codebooks side by side
    generator_hidden: int = 0  # h: 0 (default) no generator; h > 0: a residual d→h→d MLP after the combine

    def __post_init__(self) -> None:
        choice("combine", self.combine, COMBINES)
        if self.coordinates < 1:
            raise OptionError("coordinates", f"expected a number of coordinates >= 1, got {self.coordinates}")
        if self.codebook_size is not None and self.codebook_size < 2:
            raise OptionError("codebook_size", f"expected a codebook size >= 2, got {self.codebook_size}")
        if self.generator_hidden < 0:
            raise OptionError(
                "generator_hidden",
                f"expected a hidden width >= 0 (0: no generator), got {self.generator_hidden}",
            )


def smallest_radix(vocab_size: int, coordinates: int) -> int:
    """The smallest s with s^C >= V (⌈V^(1/C)⌉, computed in integers so rounding cannot miss it)."""
    s = max(1, math.ceil(vocab_size ** (1 / coordinates)))
    while s**coordinates < vocab_size:
        s += 1
    while s > 1 and (s - 1) ** coordinates >= vocab_size:
        s -= 1
    return s


def codebook_rows(vocab_size: int, coordinates: int, codebook_size: int) -> list[int]:
    """n_i: the values digit i takes for ids 0..V−1 (s, but ⌈V/s^(C−1)⌉ for the most significant digit).

    Raises naming ``codebook_size`` when s^C < V (ids would share every digit) or when s^(C−1) >= V (the most
    significant digit would always be 0, a coordinate that carries nothing; ``coordinates`` when even s = 2
    gives that)."""
    s, c, v = codebook_size, coordinates, vocab_size
    where = "model.interface.codebook_size"
    if s**c < v:
        raise ValueError(
            f"{where}: {c} coordinates of {s} values cover {s}^{c} = {s**c:,} ids, fewer than V = {v:,}; use "
            f"codebook_size >= {smallest_radix(v, c)} (or more coordinates)"
        )
    if s ** (c - 1) >= v and s == 2:  # no smaller codebook exists: too many coordinates
        raise ValueError(
            f"model.interface.coordinates: {c} coordinates are more than V = {v:,} needs: {c - 1} binary "
            f"digits already cover it, so coordinate {c} would always be 0; use at most {(v - 1).bit_length()}"
        )
    if s ** (c - 1) >= v:
        raise ValueError(
            f"{where}: {c - 1} coordinates of {s} values already cover V = {v:,}, so coordinate {c} would "
            "always be 0; use a smaller codebook_size or fewer coordinates"
        )
    return [s] * (c - 1) + [math.ceil(v / s ** (c - 1))]


def concat_widths(d_model: int, coordinates: int) -> list[int]:
    """w_i: d split among C coordinates, the first d mod C one column wider."""
    if d_model < coordinates:
        raise ValueError(
            f"model.interface.combine: concat splits d_model = {d_model} among {coordinates} coordinates, "
            "leaving some without a column; use combine: sum or fewer coordinates"
        )
    base, extra = divmod(d_model, coordinates)
    return [base + (1 if i < extra else 0) for i in range(coordinates)]


@register_interface("separable")
class SeparableCodebooks(InputInterface):
    """Mixed-radix digits of the id, one trainable codebook per digit, combined, then an optional generator."""

    Options = SeparableOptions

    def __init__(self, options: SeparableOptions, vocab_size: int, d_model: int) -> None:
        super().__init__(options, vocab_size, d_model)
        c = options.coordinates
        self.codebook_size = options.codebook_size or smallest_radix(vocab_size, c)
        self.rows = codebook_rows(vocab_size, c, self.codebook_size)
        self.widths = concat_widths(d_model, c) if options.combine == "concat" else [d_model] * c
        self.radix_powers = [self.codebook_size**i for i in range(c)]
        self.codebooks = nn.ParameterList(
            nn.Parameter(torch.empty(n, w)) for n, w in zip(self.rows, self.widths, strict=True)
        )
        hidden = options.generator_hidden
        self.generator_in = nn.Linear(d_model, hidden, bias=False) if hidden else None
        self.generator_out = nn.Linear(hidden, d_model, bias=False) if hidden else None

    def init_parameter(self, name: str, tensor: torch.Tensor) -> bool:
        if name != "generator_out.weight":
            return False  # codebooks and W₁: N(0, init_std), the model's default
        tensor.zero_()  # the generator starts as the identity: the input starts as the combined codebooks
        return True

    def digits(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The C digits of each id, least significant first."""
        s = self.codebook_size
        return [(ids // power) % s for power in self.radix_powers]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        parts = [F.embedding(d, e) for d, e in zip(self.digits(ids), self.codebooks, strict=True)]
        if self.options.combine == "concat":
            x = torch.cat(parts, dim=-1)
        else:
            x = parts[0]
            for part in parts[1:]:
                x = x + part
            if len(parts) > 1:
                x = x * (1 / math.sqrt(len(parts)))
        if self.generator_in is not None and self.generator_out is not None:
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)
            x = x + self.generator_out(F.gelu(self.generator_in(normed)))
        return x

    def num_parameters(self) -> int:
        """d·Σn_i (sum) or Σn_i·w_i (concat), plus 2·d·h: the formula of docs/models.md."""
        codebooks = sum(n * w for n, w in zip(self.rows, self.widths, strict=True))
        return codebooks + 2 * self.d_model * self.options.generator_hidden

    def describe(self) -> str:
        o, c, s = self.options, self.options.coordinates, self.codebook_size
        shapes = " + ".join(f"{n}×{w}" for n, w in zip(self.rows, self.widths, strict=True))
        combine = {"sum": f"added and divided by √{c}", "concat": f"concatenated to width {self.d_model}"}
        combine = combine[o.combine] if c > 1 else "taken as they are"
        text = (
            f"Row t is computed from {c} trained codebooks ({shapes}): t is written as {c} base-{s} digits "
            f"t_i = ⌊t / {s}^i⌋ mod {s}, and the rows E_i[t_i] are {combine}"
        )
        if o.generator_hidden:
            text += (
                f", then a trained residual MLP x + W₂·GELU(W₁·rms(x)) of hidden width {o.generator_hidden} is "
                "applied"
            )
        return text + (
            f" ({self.num_parameters():,} parameters, recorded in the interface state file; the table here is "
            "every row computed from them)."
        )
