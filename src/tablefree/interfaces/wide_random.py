"""``wide-random``: a seeded random binary code of W > K bits per id, distinct by construction, lifted like the
others. *Do more bits help?*

The code of id t is a random injective linear code over GF(2): the id's K bits, zero-padded to W, recoded by a
random invertible W×W affine map, c' = A·[c; 0] ⊕ b (A's first K columns, a random W×K matrix of rank K, carry
the id). Because A is invertible, distinct ids get distinct codes; the W bits are pseudo-random per id but carry
exactly the id's K bits of information, spread over W. No V-sized state: A, b (W×W, W) are persistent buffers,
applied through ⌈W/8⌉ byte tables, as for ``affine``. W may be up to 64; W ≤ d (the lift refuses fewer columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from tablefree.interfaces.affine import AffineCode
from tablefree.interfaces.base import register_interface
from tablefree.interfaces.fixed_code import LiftOptions
from tablefree.interfaces.options import OptionError

MAX_WIDTH = 64  # the packed code is one int64


@dataclass
class WideRandomOptions(LiftOptions):
    name: str = "wide-random"
    width: int = 32  # W, bits per code; more than the ids' K = ceil(log2 V)
    seed: int | None = None  # seed of the random map; None (default): the training seed

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.width <= MAX_WIDTH:
            raise OptionError("width", f"expected a number of bits from 2 to {MAX_WIDTH}, got {self.width}")


@register_interface("wide-random")
class WideRandomCode(AffineCode):
    """A random W-bit code per id (W > K), distinct by construction."""

    Options = WideRandomOptions

    def code_length(self) -> int:
        width = self.options.width
        if width <= self.num_bits:
            raise ValueError(
                f"model.interface.width: {width} bits is not more than the K = {self.num_bits} bits of the ids "
                f"(V = {self.vocab_size}); use a width from {self.num_bits + 1} to {MAX_WIDTH}"
            )
        return width

    def map_bits(self) -> int:
        return self.options.width

    def describe_code(self) -> str:
        return (
            f"a random {self.code_width}-bit code of t: its K = {self.num_bits} id bits, zero-padded to "
            f"{self.code_width}, recoded by a random invertible affine map c' = A·c ⊕ b over GF(2) "
            f"(`seed={self.options.seed}`), so that distinct ids get distinct codes"
        )
