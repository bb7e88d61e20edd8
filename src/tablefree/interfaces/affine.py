"""``affine``: the canonical code recoded by a fixed random invertible affine map over GF(2), c' = A·c ⊕ b.

A (K×K) and b (K) are persistent, non-trainable buffers, so a checkpoint reloads the exact map; loading a
singular A is refused. The map is applied to integer ids through ⌈K/8⌉ byte tables of 256 entries derived
from (A, b) (``codes.affine_id_tables``), rebuilt whenever A or b change. ``AffineCode`` is also the base of the
interfaces built on a seeded GF(2) map of another size (``wide-random``, ``hashed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tablefree.codes import AffineMap, affine_encode_ids, affine_id_tables
from tablefree.interfaces.base import register_interface
from tablefree.interfaces.fixed_code import CodeOptions, FixedCode


@dataclass
class AffineOptions(CodeOptions):
    name: str = "affine"
    # Seed of (A, b). None (default): the training seed, so the choice of A is part of a sweep's seed variation;
    # an int holds A fixed across seeds.
    seed: int | None = None


@register_interface("affine")
class AffineCode(FixedCode):
    """The canonical code recoded by a fixed random invertible affine map over GF(2)."""

    Options = AffineOptions

    def map_bits(self) -> int:
        """The size of the GF(2) map: the id's K bits (zero-padded when larger)."""
        return self.num_bits

    def map_seed(self) -> int:
        seed = self.options.seed
        return 0 if seed is None else seed  # build_model resolves None to the training seed first

    def packed_width(self) -> int:
        return self.map_bits()

    def register_fixed_buffers(self) -> None:
        k = self.map_bits()
        self.register_buffer("affine_matrix", torch.empty(k, k, dtype=torch.int64))
        self.register_buffer("affine_offset", torch.empty(k, dtype=torch.int64))
        self.register_buffer("id_tables", torch.empty((k + 7) // 8, 256, dtype=torch.int64), persistent=False)

    def reset_fixed_state(self) -> None:
        affine = AffineMap.from_seed(self.map_bits(), self.map_seed())
        self.affine_matrix.copy_(affine.matrix)
        self.affine_offset.copy_(affine.offset)
        super().reset_fixed_state()
        self._rebuild_tables()

    def _rebuild_tables(self) -> None:
        if self.affine_matrix.device.type != "meta":
            self.id_tables.copy_(affine_id_tables(self.affine_map, self.bit_order))

    @property
    def affine_map(self) -> AffineMap:
        return AffineMap(self.affine_matrix, self.affine_offset)

    def packed_bit_of_code_bit(self) -> torch.Tensor:
        return torch.arange(self.code_width, device="cpu")  # the tables pack code bit i at integer bit i

    def packed_code(self, ids: torch.Tensor) -> torch.Tensor:
        return affine_encode_ids(ids, self.id_tables)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        matrix, offset = state_dict.get(prefix + "affine_matrix"), state_dict.get(prefix + "affine_offset")
        if matrix is not None and offset is not None and matrix.device.type != "meta":
            AffineMap.from_tensors(matrix.to(torch.int64), offset.to(torch.int64))  # raises if singular
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._rebuild_tables()

    def describe_code(self) -> str:
        return (
            f"the K-bit binary code of t (K = {self.num_bits}, bit order `{self.bit_order}`), recoded by "
            f"the affine map c' = A·c ⊕ b over GF(2) (`seed={self.options.seed}`)"
        )

    def describe(self) -> str:
        return super().describe() + "\n\n" + describe_map(self.affine_map)


def describe_map(affine: AffineMap) -> str:
    """A and b in the model card: one row of bits per line (A is the last code block of the card)."""
    rows = "\n".join("".join(str(int(v)) for v in row) for row in affine.matrix.tolist())
    offset = "".join(str(int(v)) for v in affine.offset.tolist())
    return (
        "A (row i lists A[i, 0..K-1]; c'_i = sum_j A[i, j]·c_j mod 2, then xor b_i):\n\n"
        f"```\n{rows}\n```\n\nb = `{offset}` (b_0 first)"
    )
