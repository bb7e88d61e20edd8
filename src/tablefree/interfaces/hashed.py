"""``hashed``: codes of K' < K bits, so that ids collide: the negative control. *Does identity matter?*

The code of id t is the first K' bits of a random affine recoding of its K-bit code, c' = (A·c ⊕ b)[:K'] over
GF(2) (a random linear hash): every K'-bit code is shared by at most 2^(K−K') ids, and the model cannot tell
ids with the same code apart at its input. K' defaults to K − 2 (each code shared by up to 4 ids). A and b are
persistent buffers, as for ``affine``; nothing V-sized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tablefree.interfaces.affine import AffineCode
from tablefree.interfaces.base import register_interface
from tablefree.interfaces.fixed_code import LiftOptions
from tablefree.interfaces.options import OptionError


@dataclass
class HashedOptions(LiftOptions):
    name: str = "hashed"
    bits: int | None = None  # K' < K; None (default): K − 2
    seed: int | None = None  # seed of the hash (A, b); None (default): the training seed

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bits is not None and self.bits < 1:
            raise OptionError("bits", f"expected a number of bits >= 1, got {self.bits}")


@register_interface("hashed")
class HashedCode(AffineCode):
    """The first K' < K bits of a random affine recoding of the id's code: a hash with collisions."""

    Options = HashedOptions

    def code_length(self) -> int:
        k = self.num_bits
        bits = k - 2 if self.options.bits is None else self.options.bits
        if not 1 <= bits < k:
            raise ValueError(
                f"model.interface.bits: {bits} bits must be from 1 to K - 1 = {k - 1} (V = {self.vocab_size}): "
                "fewer bits than the ids have, so that ids collide"
            )
        return bits

    def collisions(self) -> int:
        """How many ids share their code with an id before them: V minus the number of distinct codes."""
        codes = self.packed_code(torch.arange(self.vocab_size, device=self.id_tables.device))
        codes = codes & ((1 << self.code_width) - 1)
        return self.vocab_size - int(torch.unique(codes).numel())

    def describe_code(self) -> str:
        return (
            f"the first K' = {self.code_width} bits of a random affine recoding c' = A·c ⊕ b over GF(2) "
            f"(`seed={self.options.seed}`) of the K = {self.num_bits}-bit code of t: a hash, so ids collide "
            f"({self.collisions():,} of the {self.vocab_size:,} ids share their code with another)"
        )
