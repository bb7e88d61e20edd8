"""What the binary-code interfaces share: an integer code per id -> its bits -> {0,1} or {-1,+1} -> width d.

Lifting a code of K' bits to width d uses no trainable projection:

* ``tile`` (default): the whole code repeated, ``x[j] = c[j mod K']`` — "repeated to model width".
* ``interleave``: each bit repeated, ``x[j] = c[j // r]`` with ``r = ceil(d / K')`` when that gives every bit a
  copy, else ``x[j] = c[floor(j·K' / d)]`` (each bit ⌊d/K'⌋ or ⌈d/K'⌉ times).

Every bit gets at least one copy, so ids with distinct codes always get distinct inputs; d < K' is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tablefree.codes import id_bit_of_code_bit, num_bits
from tablefree.interfaces.base import InputInterface, check_token_ids
from tablefree.interfaces.options import (
    MAX_INPUT_SCALE,
    InterfaceConfig,
    OptionError,
    choice,
    input_scale_error,
)

LIFTS = ("tile", "interleave")
VALUE_SETS = ("01", "pm1")
BIT_ORDERS = ("lsb", "msb")


@dataclass
class LiftOptions(InterfaceConfig):
    """How a binary code becomes a d-wide input: the lift and the value of a bit."""

    lift: str = "tile"  # tile: the whole code repeated; interleave: each bit repeated
    values: str = "01"  # "01": bits as {0, 1};  "pm1": bits as {-1, +1}
    # Every input value times this. The first block's RMSNorm does not see it, but the residual stream does: a
    # 9-bit code tiled to d = 64 has row norm about 5.7 against 0.16 for the table's N(0, 0.02) start.
    scale: float = 1.0

    def __post_init__(self) -> None:
        choice("lift", self.lift, LIFTS)
        choice("values", self.values, VALUE_SETS)
        if not 0 < self.scale <= MAX_INPUT_SCALE:  # the type is checked by the config reader; NaN fails too
            raise OptionError("scale", input_scale_error(self.scale))


@dataclass
class CodeOptions(LiftOptions):
    """Options of the id's own binary code (``canonical``), and the base of ``affine``'s."""

    name: str = "canonical"
    bit_order: str = "lsb"  # lsb | msb: which end of the id is bit 0 of the code vector

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("bit_order", self.bit_order, BIT_ORDERS)


def check_lift_width(k: int, d_model: int) -> None:
    """A K-bit code lifted to width d < K would drop bits (distinct ids would share an input): refused."""
    if d_model < k:
        raise ValueError(
            f"model.interface.lift: d_model ({d_model}) is smaller than the code's K = {k} bits, so bits "
            f"{d_model}..{k - 1} would get no copy and distinct ids would share an input; use d_model >= {k}"
        )


def lift_index(k: int, d_model: int, lift: str) -> torch.Tensor:
    """Which code-vector bit feeds each of the d input dimensions; every bit feeds at least one (d >= K).

    ``interleave`` keeps its original rule, runs of r = ceil(d/K) copies, wherever that reaches every bit
    (always when K divides d), so such checkpoints keep their meaning; where it would leave the last bits
    without a copy (e.g. d=100, K=16: r=7 reaches only bits 0..14) it spreads the bits evenly instead:
    x_j = c_{floor(j·K/d)}, each bit floor(d/K) or ceil(d/K) times.
    """
    check_lift_width(k, d_model)
    positions = torch.arange(d_model, device="cpu")
    if lift == "tile":
        return positions % k
    repeats = math.ceil(d_model / k)
    if (k - 1) * repeats < d_model:  # the last bit's run starts inside the width
        return positions // repeats
    return positions * k // d_model


def describe_lift(options: LiftOptions, k: int, d_model: int) -> str:
    values = "{0, 1}" if options.values == "01" else "{-1, +1}"
    if options.scale != 1.0:
        values += f" times {options.scale:g}"
    if options.lift == "tile":
        rule = f"x_j = c_{{j mod {k}}}"
    elif (k - 1) * math.ceil(d_model / k) < d_model:
        rule = f"x_j = c_{{floor(j / {math.ceil(d_model / k)})}}"
    else:
        rule = f"x_j = c_{{floor(j·{k} / {d_model})}}"
    return (
        f"with bits as {values} (`values={options.values}`), lifted to width {d_model} by `{options.lift}` "
        f"({rule})"
    )


class FixedCode(InputInterface):
    """Base of the binary-code interfaces: an integer per id holding its code (``packed_code``), whose
    ``code_width`` bits are read out, mapped to {0,1} or {-1,+1} and lifted to width d.

    The bits are extracted K'-wide (a shift and a mask) and only then gathered to width d, so the per-token work
    is one d-wide copy, like a table lookup; no V-sized state exists. ``num_bits`` is K = ceil(log2 V), the
    id's own length; ``code_width`` (K' below) is the length of the code that is lifted (K unless a subclass
    widens or narrows it).
    """

    Options = CodeOptions

    def __init__(self, options: LiftOptions, vocab_size: int, d_model: int) -> None:
        super().__init__(options, vocab_size, d_model)
        self.num_bits = num_bits(vocab_size)
        self.code_width = self.code_length()
        check_lift_width(self.code_width, d_model)
        # int32 arithmetic moves half the bytes of int64; packed codes of up to 31 bits fit.
        self.code_dtype = torch.int32 if self.packed_width() <= 31 else torch.int64
        # K'- and d-sized, derived from the options, so not saved in checkpoints.
        self.register_buffer(
            "bit_shifts", torch.empty(self.code_width, dtype=self.code_dtype), persistent=False
        )
        self.register_buffer("lift_index", torch.empty(d_model, dtype=torch.int64), persistent=False)
        self.register_fixed_buffers()
        self.reset_fixed_state()

    def code_length(self) -> int:
        """K': the number of code bits that are lifted to width d."""
        return self.num_bits

    def packed_width(self) -> int:
        """How many bits the integers of ``packed_code`` use."""
        return self.num_bits

    def register_fixed_buffers(self) -> None:
        """Subclasses register their fixed state here (filled in by ``reset_fixed_state``)."""

    def reset_fixed_state(self) -> None:
        self.bit_shifts.copy_(self.packed_bit_of_code_bit())
        self.lift_index.copy_(lift_index(self.code_width, self.d_model, self.options.lift))

    @property
    def bit_order(self) -> str:
        """Which end of the id is bit 0 of the code vector (``lsb`` for codes without the option)."""
        return getattr(self.options, "bit_order", "lsb")

    def packed_bit_of_code_bit(self) -> torch.Tensor:
        """Where code-vector bit j sits in the integer returned by ``packed_code``."""
        return id_bit_of_code_bit(self.num_bits, self.bit_order)

    def packed_code(self, ids: torch.Tensor) -> torch.Tensor:
        """An integer per id holding its code (for the canonical code: the id itself)."""
        return ids

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The K'-bit code of each id, as int64 bits of shape ``ids.shape + (K',)`` (before the lift)."""
        check_token_ids(ids, self.vocab_size)
        code = self.packed_code(ids).to(self.code_dtype)
        return ((code.unsqueeze(-1) >> self.bit_shifts) & 1).to(torch.int64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        code = self.packed_code(ids).to(self.code_dtype)
        bits = ((code.unsqueeze(-1) >> self.bit_shifts) & 1).to(torch.get_default_dtype())
        if self.options.values == "pm1":
            bits = bits * 2 - 1
        if self.options.scale != 1.0:
            bits = bits * self.options.scale
        lifted = torch.index_select(bits.reshape(-1, self.code_width), 1, self.lift_index)
        return lifted.view(*ids.shape, self.d_model)

    def describe_code(self) -> str:
        """What the code of id t is (the start of the model card's sentence)."""
        return f"the K-bit binary code of t (K = {self.num_bits}, bit order `{self.bit_order}`)"

    def describe(self) -> str:
        return (
            f"Row t is {self.describe_code()}, {describe_lift(self.options, self.code_width, self.d_model)}."
        )
