"""Fixed token codes: the bit and GF(2) mathematics behind the table-free input interfaces.

Everything here is a pure function. Codes are computed on the fly from token ids with integer and bit
operations; nothing of size V (vocabulary) is ever materialised.

Conventions
-----------
* A code is a K-bit vector, K = ceil(log2 V) (at least 1).
* ``bit_order="lsb"`` (default): bit j of the vector is bit j of the integer id (LSB first).
  ``"msb"``: bit j of the vector is bit K-1-j of the id.
* An affine recoding is c' = A·c ⊕ b over GF(2), with A a K×K 0/1 matrix and b a K-bit vector, both
  acting on the bit *vectors* above: c'_i = (Σ_j A[i, j]·c_j mod 2) ⊕ b_i.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

BIT_ORDERS = ("lsb", "msb")


def num_bits(vocab_size: int) -> int:
    """K = ceil(log2 V), and at least 1, so every id in [0, V) has a distinct K-bit code."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return max(1, (vocab_size - 1).bit_length())


def _bit_positions(k: int, bit_order: str, device: torch.device | None = None) -> torch.Tensor:
    if bit_order not in BIT_ORDERS:
        raise ValueError(f"bit_order must be one of {BIT_ORDERS}, got {bit_order!r}")
    positions = torch.arange(k, device=device, dtype=torch.int64)
    return positions if bit_order == "lsb" else (k - 1) - positions


def ids_to_bits(ids: torch.Tensor, k: int, bit_order: str = "lsb") -> torch.Tensor:
    """Canonical code: the K bits of each id, as an int64 tensor of shape ``ids.shape + (k,)``."""
    shifts = _bit_positions(k, bit_order, ids.device)
    return (ids.to(torch.int64).unsqueeze(-1) >> shifts) & 1


def bits_to_ids(bits: torch.Tensor, bit_order: str = "lsb") -> torch.Tensor:
    """Inverse of :func:`ids_to_bits`: pack the last dimension back into integer ids."""
    k = bits.shape[-1]
    shifts = _bit_positions(k, bit_order, bits.device)
    return (bits.to(torch.int64) << shifts).sum(-1)


def gf2_matvec(matrix: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """A·c over GF(2) for a batch of bit vectors ``bits[..., K]``; returns int64 bits."""
    # Elementwise AND + sum + parity, all in integers: exact, works on every device (CUDA has no int64
    # matmul) and is untouched by autocast.
    return (bits.to(torch.int64).unsqueeze(-2) & matrix.to(torch.int64)).sum(-1) & 1


def gf2_rank(matrix: torch.Tensor) -> int:
    """Rank of a 0/1 matrix over GF(2), by Gaussian elimination on Python-int rows."""
    rows = [_row_to_int(r) for r in matrix.to("cpu", torch.int64).tolist()]
    rank = 0
    ncols = matrix.shape[1]
    for col in range(ncols):
        pivot = next((i for i in range(rank, len(rows)) if (rows[i] >> col) & 1), None)
        if pivot is None:
            continue
        rows[rank], rows[pivot] = rows[pivot], rows[rank]
        for i in range(len(rows)):
            if i != rank and (rows[i] >> col) & 1:
                rows[i] ^= rows[rank]
        rank += 1
    return rank


def gf2_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """Inverse of a square 0/1 matrix over GF(2). Raises ``ValueError`` if it is singular."""
    k = _check_square_binary(matrix)
    # Augmented rows [A | I] packed into Python ints: bits 0..k-1 hold A, bits k..2k-1 hold I.
    rows = [_row_to_int(r) | (1 << (k + i)) for i, r in enumerate(matrix.to("cpu", torch.int64).tolist())]
    for col in range(k):
        pivot = next((i for i in range(col, k) if (rows[i] >> col) & 1), None)
        if pivot is None:
            raise ValueError(
                f"matrix is singular over GF(2) (rank {gf2_rank(matrix)} < {k}); expected A in GL({k}, 2)"
            )
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for i in range(k):
            if i != col and (rows[i] >> col) & 1:
                rows[i] ^= rows[col]
    inverse = [[(row >> (k + j)) & 1 for j in range(k)] for row in rows]
    return torch.tensor(inverse, dtype=torch.int64, device=matrix.device)


def random_invertible_matrix(k: int, seed: int) -> torch.Tensor:
    """A uniformly random element of GL(k, 2): rejection sampling of uniform 0/1 matrices with a rank check.

    Uses Python's ``random.Random(seed)``, whose stream is stable across Python versions and platforms, so
    the same seed gives the same A everywhere. About 29% of uniform matrices are invertible, so a few draws
    suffice.
    """
    rng = random.Random(f"tablefree-affine-A:{seed}")
    while True:
        rows = [rng.getrandbits(k) for _ in range(k)]
        matrix = torch.tensor(
            [[(r >> j) & 1 for j in range(k)] for r in rows], dtype=torch.int64, device="cpu"
        )
        if gf2_rank(matrix) == k:
            return matrix


def random_offset(k: int, seed: int) -> torch.Tensor:
    """A seeded uniformly random K-bit vector b."""
    rng = random.Random(f"tablefree-affine-b:{seed}")
    value = rng.getrandbits(k)
    return torch.tensor([(value >> j) & 1 for j in range(k)], dtype=torch.int64, device="cpu")


@dataclass(frozen=True)
class AffineMap:
    """c' = A·c ⊕ b over GF(2), with its inverse c = A⁻¹·(c' ⊕ b)."""

    matrix: torch.Tensor  # A, K×K int64 0/1
    offset: torch.Tensor  # b, K int64 0/1

    @staticmethod
    def from_seed(k: int, seed: int) -> AffineMap:
        return AffineMap(random_invertible_matrix(k, seed), random_offset(k, seed))

    @staticmethod
    def from_tensors(matrix: torch.Tensor, offset: torch.Tensor) -> AffineMap:
        """Validate and wrap a loaded (A, b); a non-invertible A is an error."""
        k = _check_square_binary(matrix)
        if offset.shape != (k,) or not _is_binary(offset):
            raise ValueError(
                f"affine offset b must be a 0/1 vector of length {k}, got shape {tuple(offset.shape)}"
            )
        gf2_inverse(matrix)  # raises if singular
        return AffineMap(matrix.to(torch.int64), offset.to(torch.int64))

    @property
    def num_bits(self) -> int:
        return self.matrix.shape[0]

    def encode(self, bits: torch.Tensor) -> torch.Tensor:
        return gf2_matvec(self.matrix.to(bits.device), bits) ^ self.offset.to(bits.device)

    def decode(self, bits: torch.Tensor) -> torch.Tensor:
        inverse = gf2_inverse(self.matrix).to(bits.device)
        return gf2_matvec(inverse, bits ^ self.offset.to(bits.device))


def id_bit_of_code_bit(k: int, bit_order: str = "lsb") -> torch.Tensor:
    """For each code-vector index j, the bit of the integer id that holds it."""
    return _bit_positions(k, bit_order, torch.device("cpu"))


def affine_id_tables(affine: AffineMap, bit_order: str = "lsb") -> torch.Tensor:
    """Byte tables that apply c' = A·c ⊕ b to integer ids: ⌈K/8⌉ × 256 packed codes.

    A·c is the XOR of the columns of A selected by the set bits of c, so it splits over the id's bytes:
    ``pack(c') = T[0][id & 255] ⊕ T[1][(id >> 8) & 255] ⊕ …`` with b folded into T[0]. ``pack`` puts code-vector
    index i at integer bit i. The tables hold 256·⌈K/8⌉ entries whatever V is (no V-sized state); K may be up
    to 64 (a 64-bit code is held in int64 as two's complement).
    """
    k = affine.num_bits
    columns = [_row_to_int(column) for column in affine.matrix.to("cpu", torch.int64).T.tolist()]
    code_index = {int(m): j for j, m in enumerate(id_bit_of_code_bit(k, bit_order).tolist())}
    chunks = (k + 7) // 8
    rows = [[0] * 256 for _ in range(chunks)]
    for chunk in range(chunks):
        for byte in range(256):
            packed = 0
            for bit in range(8):
                id_bit = 8 * chunk + bit
                if id_bit < k and (byte >> bit) & 1:
                    packed ^= columns[code_index[id_bit]]
            rows[chunk][byte] = packed
    offset = _row_to_int(affine.offset.tolist())
    rows[0] = [value ^ offset for value in rows[0]]
    # Codes of 64 bits do not fit a signed int64: stored as two's complement, bits read back unchanged.
    return torch.tensor([[_as_int64(v) for v in row] for row in rows], dtype=torch.int64, device="cpu")


def _as_int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def affine_encode_ids(ids: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """pack(A·c(id) ⊕ b) for every id, from :func:`affine_id_tables` (two gathers and an XOR for K = 16)."""
    packed = tables[0][ids & 255]
    for chunk in range(1, tables.shape[0]):
        packed = packed ^ tables[chunk][(ids >> (8 * chunk)) & 255]
    return packed


def _row_to_int(row: list[int]) -> int:
    return sum(int(v) << j for j, v in enumerate(row))


def _is_binary(t: torch.Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all())


def _check_square_binary(matrix: torch.Tensor) -> int:
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"affine matrix A must be square K×K, got shape {tuple(matrix.shape)}")
    if not _is_binary(matrix):
        raise ValueError("affine matrix A must contain only 0 and 1")
    return matrix.shape[0]
