from __future__ import annotations

import pytest
import torch

from tablefree.codes import (
    AffineMap,
    affine_encode_ids,
    affine_id_tables,
    bits_to_ids,
    gf2_inverse,
    gf2_matvec,
    gf2_rank,
    ids_to_bits,
    num_bits,
    random_invertible_matrix,
    random_offset,
)


@pytest.mark.parametrize(
    ("vocab", "k"),
    [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (49_152, 16), (65_536, 16), (65_537, 17), (50_257, 16)],
)
def test_num_bits(vocab: int, k: int) -> None:
    assert num_bits(vocab) == k


def test_num_bits_rejects_empty_vocab() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        num_bits(0)


def _reference_bits(token: int, k: int, msb_first: bool) -> list[int]:
    bits = [(token >> j) & 1 for j in range(k)]
    return bits[::-1] if msb_first else bits


@pytest.mark.parametrize("bit_order", ["lsb", "msb"])
def test_canonical_code_is_exhaustive_bijection(bit_order: str) -> None:
    k = 16
    ids = torch.arange(2**k)
    bits = ids_to_bits(ids, k, bit_order)
    assert bits.shape == (2**k, k)
    assert torch.equal(bits_to_ids(bits, bit_order), ids)
    for token in [0, 1, 2, 255, 256, 40_000, 65_535]:
        assert bits[token].tolist() == _reference_bits(token, k, bit_order == "msb")


def _reference_affine(token: int, matrix: list[list[int]], offset: list[int]) -> int:
    k = len(offset)
    c = [(token >> j) & 1 for j in range(k)]
    out = 0
    for i in range(k):
        parity = 0
        for j in range(k):
            parity ^= matrix[i][j] & c[j]
        out |= (parity ^ offset[i]) << i
    return out


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_affine_code_is_bijection_and_inverts(seed: int) -> None:
    k = 16
    affine = AffineMap.from_seed(k, seed)
    ids = torch.arange(2**k)
    encoded = affine.encode(ids_to_bits(ids, k))
    codes = bits_to_ids(encoded)
    assert torch.unique(codes).numel() == 2**k  # every code distinct
    assert torch.equal(bits_to_ids(affine.decode(encoded)), ids)
    matrix, offset = affine.matrix.tolist(), affine.offset.tolist()
    samples = torch.randint(0, 2**k, (300,), generator=torch.Generator().manual_seed(seed)).tolist()
    for token in [*samples, 0, 65_535]:
        assert int(codes[token]) == _reference_affine(token, matrix, offset)


@pytest.mark.parametrize(("k", "bit_order"), [(16, "lsb"), (16, "msb"), (17, "lsb"), (5, "msb")])
def test_affine_byte_tables_match_the_vector_map_on_every_id(k: int, bit_order: str) -> None:
    affine = AffineMap.from_seed(k, 2)
    ids = torch.arange(2**k)
    packed = affine_encode_ids(ids, affine_id_tables(affine, bit_order))
    expected = bits_to_ids(affine.encode(ids_to_bits(ids, k, bit_order)))  # code bit i at integer bit i
    assert torch.equal(packed, expected)
    assert torch.unique(packed).numel() == 2**k


def test_affine_draws_depend_on_seed_and_are_reproducible() -> None:
    assert torch.equal(random_invertible_matrix(16, 3), random_invertible_matrix(16, 3))
    assert not torch.equal(random_invertible_matrix(16, 3), random_invertible_matrix(16, 4))
    assert torch.equal(random_offset(16, 3), random_offset(16, 3))
    assert gf2_rank(random_invertible_matrix(16, 5)) == 16


def test_gf2_inverse_is_inverse() -> None:
    matrix = random_invertible_matrix(12, 9)
    inverse = gf2_inverse(matrix)
    product = (matrix @ inverse) % 2
    assert torch.equal(product, torch.eye(12, dtype=torch.int64))
    bits = ids_to_bits(torch.arange(4096), 12)
    assert torch.equal(gf2_matvec(inverse, gf2_matvec(matrix, bits)), bits)


def test_singular_matrix_is_rejected() -> None:
    singular = random_invertible_matrix(8, 1).clone()
    singular[3] = singular[1] ^ singular[2]  # a dependent row
    assert gf2_rank(singular) == 7
    with pytest.raises(ValueError, match="singular"):
        gf2_inverse(singular)
    with pytest.raises(ValueError, match="singular"):
        AffineMap.from_tensors(singular, torch.zeros(8, dtype=torch.int64))


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="square"):
        AffineMap.from_tensors(torch.ones(3, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="only 0 and 1"):
        AffineMap.from_tensors(torch.full((3, 3), 2), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="offset"):
        AffineMap.from_tensors(torch.eye(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
