"""The three input interfaces, behind one registry.

* ``learned``   — an ordinary trainable V×d embedding table (the control).
* ``canonical`` — the token id's own K-bit binary code, lifted to width d.
* ``affine``    — that code recoded by a fixed random invertible affine map over GF(2), c' = A·c ⊕ b.

The fixed codes have **no trainable parameters and no V-sized buffer**: codes are computed from ids on the fly
(``tablefree.codes``). Lifting a K-bit code to width d uses no trainable projection:

* ``tile`` (default): the whole code repeated, ``x[j] = c[j mod K]`` — "repeated to model width".
* ``interleave``: each bit repeated, ``x[j] = c[j // r]`` with ``r = ceil(d / K)``.

When d is not a multiple of K the code is repeated ceil(d/K) times and truncated to d, so the last copy is
partial (tile) or the last bits get fewer copies (interleave).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from tablefree.codes import AffineMap, ids_to_bits, num_bits
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
    """Base of the fixed-code interfaces: K-bit code → {0,1} or {−1,+1} values → lifted to width d."""

    def __init__(self, config: InterfaceConfig, vocab_size: int, d_model: int) -> None:
        super().__init__()
        if config.lift not in ("tile", "interleave"):
            raise ValueError(f"model.interface.lift: expected 'tile' or 'interleave', got {config.lift!r}")
        if config.values not in ("01", "pm1"):
            raise ValueError(f"model.interface.values: expected '01' or 'pm1', got {config.values!r}")
        self.config = config
        self.vocab_size = vocab_size
        self.num_bits = num_bits(vocab_size)
        self.d_model = d_model
        # d-sized gather index (not V-sized); derived from the config, so not saved in checkpoints.
        self.register_buffer("lift_index", torch.empty(d_model, dtype=torch.int64), persistent=False)
        self.register_fixed_buffers()
        self.reset_buffers()

    def register_fixed_buffers(self) -> None:
        """Subclasses register their fixed state here (filled in by ``reset_buffers``)."""

    def reset_buffers(self) -> None:
        """(Re)compute the fixed buffers, e.g. after ``to_empty`` on a model built on the meta device."""
        self.lift_index.copy_(lift_index(self.num_bits, self.d_model, self.config.lift))

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The K-bit code of each id (int64 0/1, shape ids.shape + (K,))."""
        return ids_to_bits(ids, self.num_bits, self.config.bit_order)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        values = self.code_bits(ids).to(torch.get_default_dtype())
        if self.config.values == "pm1":
            values = values * 2 - 1
        return values[..., self.lift_index]


def lift_index(k: int, d_model: int, lift: str) -> torch.Tensor:
    """Which code bit feeds each of the d input dimensions."""
    positions = torch.arange(d_model, device="cpu")
    if lift == "tile":
        return positions % k
    repeats = math.ceil(d_model / k)
    return positions // repeats


@register_interface("canonical")
class CanonicalCode(FixedCode):
    """The token id's own binary code."""


@register_interface("affine")
class AffineCode(FixedCode):
    """The canonical code recoded by a fixed random invertible affine map over GF(2).

    A (K×K) and b (K) are persistent, non-trainable buffers, so a checkpoint reloads the exact map;
    loading a singular A is refused (``_load_from_state_dict``).
    """

    def register_fixed_buffers(self) -> None:
        k = self.num_bits
        self.register_buffer("affine_matrix", torch.empty(k, k, dtype=torch.int64))
        self.register_buffer("affine_offset", torch.empty(k, dtype=torch.int64))

    def reset_buffers(self) -> None:
        super().reset_buffers()
        affine = AffineMap.from_seed(self.num_bits, self.config.affine_seed)
        self.affine_matrix.copy_(affine.matrix)
        self.affine_offset.copy_(affine.offset)

    @property
    def affine_map(self) -> AffineMap:
        return AffineMap(self.affine_matrix, self.affine_offset)

    def code_bits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.affine_map.encode(super().code_bits(ids))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        matrix, offset = state_dict.get(prefix + "affine_matrix"), state_dict.get(prefix + "affine_offset")
        if matrix is not None and offset is not None and matrix.device.type != "meta":
            AffineMap.from_tensors(matrix.to(torch.int64), offset.to(torch.int64))  # raises if singular
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
