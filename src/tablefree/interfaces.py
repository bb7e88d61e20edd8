"""The three input interfaces, behind one registry.

* ``learned``   — an ordinary trainable V×d embedding table (the control).
* ``canonical`` — the token id's own K-bit binary code, lifted to width d.
* ``affine``    — that code recoded by a fixed random invertible affine map over GF(2), c' = A·c ⊕ b.

The fixed codes have **no trainable parameters and no V-sized buffer**: codes are computed from ids on the fly
(``tablefree.codes``). Lifting a K-bit code to width d uses no trainable projection:

* ``tile`` (default): the whole code repeated, ``x[j] = c[j mod K]`` — "repeated to model width".
* ``interleave``: each bit repeated, ``x[j] = c[j // r]`` with ``r = ceil(d / K)`` when that gives every bit a
  copy, else ``x[j] = c[floor(j·K / d)]`` (each bit ⌊d/K⌋ or ⌈d/K⌉ times).

Every bit gets at least one copy, so distinct ids always get distinct inputs; d < K is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from tablefree.codes import AffineMap, affine_encode_ids, affine_id_tables, id_bit_of_code_bit, num_bits
from tablefree.config import InterfaceConfig

INTERFACES: dict[str, type[nn.Module]] = {}


def register_interface(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def decorate(cls: type[nn.Module]) -> type[nn.Module]:
        INTERFACES[name] = cls
        return cls

    return decorate


def build_interface(config: InterfaceConfig, vocab_size: int, d_model: int) -> nn.Module:
    """Build the input interface named by ``config.name``."""
    if config.name not in INTERFACES:
        raise ValueError(
            f"model.interface.name: unknown interface {config.name!r}; expected one of {sorted(INTERFACES)}"
        )
    return INTERFACES[config.name](config, vocab_size, d_model)


def check_token_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Raise a clear error for ids outside [0, V). Skipped while compiling (a data-dependent branch)."""
    if _is_compiling() or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside [0, {vocab_size}) (vocabulary size V={vocab_size})")


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


@register_interface("learned")
class LearnedEmbedding(nn.Module):
    """The control: a trainable V×d table."""

    def __init__(self, config: InterfaceConfig, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        return nn.functional.embedding(ids, self.weight)


class FixedCode(nn.Module):
    """Base of the fixed-code interfaces: an integer code per id → its K bits → {0,1} or {−1,+1} → lifted to d.

    The bits are extracted K-wide (a shift and a mask) and only then gathered to width d, so the per-token work
    is one d-wide copy, like a table lookup; no V-sized state exists.
    """

    def __init__(self, config: InterfaceConfig, vocab_size: int, d_model: int) -> None:
        super().__init__()
        if config.lift not in ("tile", "interleave"):
            raise ValueError(f"model.interface.lift: expected 'tile' or 'interleave', got {config.lift!r}")
        if config.values not in ("01", "pm1"):
            raise ValueError(f"model.interface.values: expected '01' or 'pm1', got {config.values!r}")
        if config.bit_order not in ("lsb", "msb"):
            raise ValueError(f"model.interface.bit_order: expected 'lsb' or 'msb', got {config.bit_order!r}")
        self.config = config
        self.vocab_size = vocab_size
        self.num_bits = num_bits(vocab_size)
        self.d_model = d_model
        check_lift_width(self.num_bits, d_model)
        # int32 arithmetic moves half the bytes of int64; codes of up to 31 bits fit.
        self.code_dtype = torch.int32 if self.num_bits <= 31 else torch.int64
        # K- and d-sized, derived from the config, so not saved in checkpoints.
        self.register_buffer(
            "bit_shifts", torch.empty(self.num_bits, dtype=self.code_dtype), persistent=False
        )
        self.register_buffer("lift_index", torch.empty(d_model, dtype=torch.int64), persistent=False)
        self.register_fixed_buffers()
        self.reset_buffers()

    def register_fixed_buffers(self) -> None:
        """Subclasses register their fixed state here (filled in by ``reset_buffers``)."""

    def reset_buffers(self) -> None:
        """(Re)compute the fixed buffers, e.g. after ``to_empty`` on a model built on the meta device."""
        self.bit_shifts.copy_(self.packed_bit_of_code_bit())
        self.lift_index.copy_(lift_index(self.num_bits, self.d_model, self.config.lift))

    def packed_bit_of_code_bit(self) -> torch.Tensor:
        """Where code-vector bit j sits in the integer returned by ``packed_code``."""
        return id_bit_of_code_bit(self.num_bits, self.config.bit_order)

    def packed_code(self, ids: torch.Tensor) -> torch.Tensor:
        """An integer per id holding its K-bit code (for the canonical code: the id itself)."""
        return ids

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        code = self.packed_code(ids).to(self.code_dtype)
        bits = ((code.unsqueeze(-1) >> self.bit_shifts) & 1).to(torch.get_default_dtype())
        if self.config.values == "pm1":
            bits = bits * 2 - 1
        lifted = torch.index_select(bits.reshape(-1, self.num_bits), 1, self.lift_index)
        return lifted.view(*ids.shape, self.d_model)


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


@register_interface("canonical")
class CanonicalCode(FixedCode):
    """The token id's own binary code."""


@register_interface("affine")
class AffineCode(FixedCode):
    """The canonical code recoded by a fixed random invertible affine map over GF(2).

    A (K×K) and b (K) are persistent, non-trainable buffers, so a checkpoint reloads the exact map; loading a
    singular A is refused. The map is applied to integer ids through ⌈K/8⌉ byte tables of 256 entries derived
    from (A, b) (``codes.affine_id_tables``), rebuilt whenever A or b change.
    """

    def register_fixed_buffers(self) -> None:
        k = self.num_bits
        self.register_buffer("affine_matrix", torch.empty(k, k, dtype=torch.int64))
        self.register_buffer("affine_offset", torch.empty(k, dtype=torch.int64))
        self.register_buffer("id_tables", torch.empty((k + 7) // 8, 256, dtype=torch.int64), persistent=False)

    def reset_buffers(self) -> None:
        affine = AffineMap.from_seed(self.num_bits, self.config.affine_seed)
        self.affine_matrix.copy_(affine.matrix)
        self.affine_offset.copy_(affine.offset)
        super().reset_buffers()
        self._rebuild_tables()

    def _rebuild_tables(self) -> None:
        if self.affine_matrix.device.type != "meta":
            self.id_tables.copy_(affine_id_tables(self.affine_map, self.config.bit_order))

    @property
    def affine_map(self) -> AffineMap:
        return AffineMap(self.affine_matrix, self.affine_offset)

    def packed_bit_of_code_bit(self) -> torch.Tensor:
        return torch.arange(self.num_bits, device="cpu")  # the tables pack code bit i at integer bit i

    def packed_code(self, ids: torch.Tensor) -> torch.Tensor:
        return affine_encode_ids(ids, self.id_tables)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        matrix, offset = state_dict.get(prefix + "affine_matrix"), state_dict.get(prefix + "affine_offset")
        if matrix is not None and offset is not None and matrix.device.type != "meta":
            AffineMap.from_tensors(matrix.to(torch.int64), offset.to(torch.int64))  # raises if singular
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._rebuild_tables()
