"""``projected``: the canonical (or affine) K-bit code followed by a trainable K×d linear map (K·d parameters,
32,768 for ``paper-1.7b``). *Does the missing input projection cost anything?*

Row t is W·c(t): c(t) is the code as K values ({0, 1} or {−1, +1}), W a d×K matrix, trained (like the learned
table, without weight decay unless ``optim.decay_embeddings``). The code part is the ``canonical`` or ``affine``
interface itself, at width K. ``init`` chooses W's start:

* ``normal`` (default): N(0, init_std) like every matrix of the model, so the input starts small, as a learned
  table's does;
* ``lift``: the fixed interface's own tile lift (W[j, b] = 1 when b = j mod K), so the model starts exactly as
  the ``canonical`` (or ``affine``) model of the same seed, and only training the map can make a difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tablefree.codes import num_bits
from tablefree.interfaces.base import INTERFACES, InputInterface, register_interface
from tablefree.interfaces.fixed_code import BIT_ORDERS, VALUE_SETS, FixedCode, lift_index
from tablefree.interfaces.options import InterfaceConfig, choice, parse_interface_options

CODES = ("canonical", "affine")
INITS = ("normal", "lift")


@dataclass
class ProjectedOptions(InterfaceConfig):
    name: str = "projected"
    code: str = "canonical"  # canonical | affine: the code that is projected
    values: str = "01"
    bit_order: str = "lsb"
    seed: int | None = None  # code=affine: seed of (A, b); None (default): the training seed
    init: str = "normal"  # normal: N(0, init_std); lift: start as the code's tile lift (the fixed model)

    def __post_init__(self) -> None:
        choice("code", self.code, CODES)
        choice("init", self.init, INITS)
        choice("values", self.values, VALUE_SETS)
        choice("bit_order", self.bit_order, BIT_ORDERS)

    def resolve_seed(self, seed: int) -> InterfaceConfig:
        return super().resolve_seed(seed) if self.code == "affine" else self


@register_interface("projected")
class ProjectedCode(InputInterface):
    """A fixed K-bit code, then a trainable K×d linear map."""

    Options = ProjectedOptions

    def __init__(self, options: ProjectedOptions, vocab_size: int, d_model: int) -> None:
        super().__init__(options, vocab_size, d_model)
        k = num_bits(vocab_size)
        code = {"name": options.code, "values": options.values, "bit_order": options.bit_order}
        if options.code == "affine":
            code["seed"] = options.seed
        self.code: FixedCode = INTERFACES[options.code](parse_interface_options(code), vocab_size, k)
        self.projection = nn.Linear(k, d_model, bias=False)

    def reset_fixed_state(self) -> None:
        self.code.reset_fixed_state()

    def init_parameter(self, name: str, tensor: torch.Tensor) -> bool:
        if name != "projection.weight" or self.options.init != "lift":
            return False
        k = self.code.num_bits
        lift = lift_index(k, self.d_model, "tile").to(tensor.device)
        tensor.zero_()[torch.arange(self.d_model, device=tensor.device), lift] = 1.0
        return True

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.code.code_bits(ids)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        codes = self.code(ids)  # (..., K): the tile lift at width K is the code itself
        return self.projection(codes.to(self.projection.weight.dtype))

    def describe(self) -> str:
        k = self.code.num_bits
        return (
            f"Row t is W·c(t): c(t) is {self.code.describe_code()}, as K = {k} values "
            f"({'{0, 1}' if self.options.values == '01' else '{-1, +1}'}), and W is a trained {self.d_model}×{k} "
            f"matrix ({k * self.d_model:,} parameters, recorded in the interface state file; initialised "
            f"{'as the tile lift of the code' if self.options.init == 'lift' else 'N(0, init_std)'})."
        )
