from __future__ import annotations

import pytest
import torch

from tablefree.codes import AffineMap, ids_to_bits
from tablefree.config import InterfaceConfig
from tablefree.interfaces import INTERFACES, build_interface, parse_interface_options


def opts(**options) -> InterfaceConfig:
    """An interface's options from keywords, as a config file gives them."""
    return parse_interface_options(options)


def test_registry_names() -> None:
    assert {"learned", "canonical", "affine"} <= set(INTERFACES)


@pytest.mark.parametrize("name", ["canonical", "affine"])
def test_fixed_codes_have_no_parameters_and_no_vocab_sized_state(name: str) -> None:
    vocab, d = 49_152, 2048
    interface = build_interface(opts(name=name), vocab, d)
    assert sum(p.numel() for p in interface.parameters()) == 0
    for tensor in interface.buffers():
        assert tensor.numel() < vocab  # K×K, K, or d — never V-sized


def test_tile_and_interleave_lifts() -> None:
    vocab, d = 8, 7  # K = 3, d not a multiple of K
    ids = torch.arange(vocab)
    bits = ids_to_bits(ids, 3).float()
    tile = build_interface(opts(name="canonical", lift="tile"), vocab, d)(ids)
    assert torch.equal(tile, bits[:, [0, 1, 2, 0, 1, 2, 0]])
    inter = build_interface(opts(name="canonical", lift="interleave"), vocab, d)(ids)
    assert torch.equal(inter, bits[:, [0, 0, 0, 1, 1, 1, 2]])


def test_signed_values() -> None:
    ids = torch.tensor([[0, 5]])
    out = build_interface(opts(name="canonical", values="pm1"), 8, 6)(ids)
    assert out.tolist() == [[[-1, -1, -1, -1, -1, -1], [1, -1, 1, 1, -1, 1]]]


def test_affine_interface_matches_affine_map() -> None:
    config = opts(name="affine", affine_seed=3)
    interface = build_interface(config, 1000, 20)
    k = interface.num_bits
    ids = torch.arange(1000)
    expected = AffineMap.from_seed(k, 3).encode(ids_to_bits(ids, k)).float()
    assert torch.equal(interface(ids)[:, :k], expected)


@pytest.mark.parametrize("name", ["learned", "canonical", "affine"])
def test_out_of_range_ids_name_the_id_and_vocab(name: str) -> None:
    interface = build_interface(opts(name=name), 100, 16)
    with pytest.raises(ValueError, match=r"token id 100 .*V=100"):
        interface(torch.tensor([[1, 100]]))
    with pytest.raises(ValueError, match=r"token id -1"):
        interface(torch.tensor([[-1, 3]]))


def test_no_gradient_reaches_fixed_interface() -> None:
    interface = build_interface(opts(name="affine"), 100, 16)
    out = interface(torch.tensor([[1, 2, 3]]))
    assert not out.requires_grad


def test_affine_state_reloads_and_singular_matrix_is_refused() -> None:
    source = build_interface(opts(name="affine", affine_seed=11), 500, 32)
    target = build_interface(opts(name="affine", affine_seed=0), 500, 32)
    target.load_state_dict(source.state_dict())
    ids = torch.arange(500)
    assert torch.equal(target(ids), source(ids))
    state = source.state_dict()
    state["affine_matrix"] = state["affine_matrix"].clone()
    state["affine_matrix"][0] = state["affine_matrix"][1]
    with pytest.raises(ValueError, match="singular"):
        target.load_state_dict(state)


def test_unknown_interface_and_options() -> None:
    with pytest.raises(ValueError, match="unknown interface"):
        build_interface(opts(name="onehot"), 10, 8)
    with pytest.raises(ValueError, match="lift"):
        build_interface(opts(name="canonical", lift="spiral"), 10, 8)


def _reference_lifted(name: str, config: InterfaceConfig, vocab: int, d: int) -> torch.Tensor:
    """The interface's output built the slow way: bit vectors, the affine map on vectors, then the lift."""
    from tablefree.codes import num_bits
    from tablefree.interfaces import lift_index

    k = num_bits(vocab)
    bits = ids_to_bits(torch.arange(vocab), k, config.bit_order)
    if name == "affine":
        bits = AffineMap.from_seed(k, config.affine_seed).encode(bits)
    values = bits[:, lift_index(k, d, config.lift)].float()
    return values * 2 - 1 if config.values == "pm1" else values


@pytest.mark.parametrize("name", ["canonical", "affine"])
@pytest.mark.parametrize("lift", ["tile", "interleave"])
@pytest.mark.parametrize("bit_order", ["lsb", "msb"])
@pytest.mark.parametrize("values", ["01", "pm1"])
def test_fast_path_matches_reference_construction(name: str, lift: str, bit_order: str, values: str) -> None:
    vocab, d = 3000, 50  # K = 12: two byte tables, d not a multiple of K
    config = opts(name=name, lift=lift, bit_order=bit_order, values=values, affine_seed=5)
    out = build_interface(config, vocab, d)(torch.arange(vocab))
    assert torch.equal(out, _reference_lifted(name, config, vocab, d))


DISTINCTNESS_SHAPES = [(49_152, 100), (3000, 50), (1000, 10), (300, 13)]


@pytest.mark.parametrize("name", ["canonical", "affine"])
@pytest.mark.parametrize("lift", ["tile", "interleave"])
@pytest.mark.parametrize("bit_order", ["lsb", "msb"])
@pytest.mark.parametrize("values", ["01", "pm1"])
@pytest.mark.parametrize(("vocab", "d"), DISTINCTNESS_SHAPES)
def test_every_id_gets_a_distinct_input(
    name: str, lift: str, bit_order: str, values: str, vocab: int, d: int
):
    config = opts(name=name, lift=lift, bit_order=bit_order, values=values, affine_seed=1)
    interface = build_interface(config, vocab, d)
    table = interface(torch.arange(vocab))
    # Rows are distinct if the K-bit codes read back from one column per bit are (cheaper than unique rows).
    columns = _first_column_of_each_bit(interface.lift_index)
    assert sorted(columns) == list(range(interface.num_bits))  # every bit has a copy
    weights = torch.zeros(d, dtype=torch.int64)
    for bit, column in columns.items():
        weights[column] = 1 << bit
    packed = ((table > 0).to(torch.int64) * weights).sum(1)
    assert torch.unique(packed).numel() == vocab


def _first_column_of_each_bit(index: torch.Tensor) -> dict[int, int]:
    first: dict[int, int] = {}
    for column, bit in enumerate(index.tolist()):
        first.setdefault(bit, column)
    return first


def test_interleave_spreads_bits_when_runs_of_ceil_d_over_k_fall_short() -> None:
    from tablefree.interfaces import lift_index

    index = lift_index(16, 100, "interleave")  # r = 7 would reach bits 0..14 only
    counts = torch.bincount(index, minlength=16)
    assert counts.min() >= 6 and counts.max() <= 7 and counts.sum() == 100
    assert torch.all(index[1:] >= index[:-1])  # still runs of one bit each
    assert torch.equal(lift_index(16, 2048, "interleave"), torch.arange(2048) // 128)  # K | d: unchanged
    assert torch.equal(lift_index(3, 7, "interleave"), torch.tensor([0, 0, 0, 1, 1, 1, 2]))  # already fine
    assert torch.equal(lift_index(16, 100, "tile"), torch.arange(100) % 16)


@pytest.mark.parametrize("lift", ["tile", "interleave"])
def test_width_below_the_code_length_is_refused(lift: str) -> None:
    with pytest.raises(ValueError, match=r"d_model \(8\) is smaller than the code's K = 10 bits"):
        build_interface(opts(name="canonical", lift=lift), 1000, 8)


# ----------------------------------------------------------------------------------------------------------
# The contract


@pytest.fixture
def scratch():
    from scratch_interface import scratch_interface

    with scratch_interface() as cls:
        yield cls


def test_init_weights_initialises_parameters_never_interface_buffers(scratch) -> None:
    from tablefree.config import ModelConfig
    from tablefree.model import build_model

    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64, interface="scratch")
    model = build_model(config, seed=0)
    codebook = model.input.codebook
    assert 0.95 < codebook.std().item() < 1.05  # its own N(0, 1), not init_std = 0.02
    assert torch.equal(codebook, scratch(opts(name="scratch"), 300, 32).codebook)
    assert abs(model.layers[0].mlp.w1.weight.std().item() - 0.02) < 0.003  # parameters still initialised


def test_a_new_interface_reloads_from_a_checkpoint_as_itself(scratch, tmp_path) -> None:
    from tablefree.checkpoint import load_model, save_model
    from tablefree.config import ModelConfig
    from tablefree.model import build_model

    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64)
    config.interface = opts(name="scratch", scale=2.0)
    model = build_model(config, seed=1)
    save_model(tmp_path / "ck", model)
    loaded, _ = load_model(tmp_path / "ck")
    assert loaded.config.interface == opts(name="scratch", scale=2.0)
    assert torch.equal(loaded.input.codebook, model.input.codebook)


def test_options_parse_per_interface_with_errors_naming_the_field() -> None:
    from tablefree.config import ModelConfig

    assert type(opts(name="affine")).__name__ == "AffineOptions"
    assert ModelConfig(interface="canonical").interface == opts(name="canonical")
    with pytest.raises(ValueError, match=r"interface\.name: unknown interface 'canonicl'; expected one of"):
        ModelConfig(interface="canonicl")
    with pytest.raises(ValueError, match=r"interface\.lfit: no interface has the option 'lfit'"):
        ModelConfig(interface={"name": "canonical", "lfit": "tile"})
    with pytest.raises(ValueError, match=r"interface\.lift: expected one of \['tile', 'interleave'\]"):
        ModelConfig(interface={"name": "canonical", "lift": "spiral"})
    # Another interface's option is checked, then ignored (a sweep's shared recipe).
    assert ModelConfig(interface={"name": "learned", "lift": "interleave"}).interface == opts(name="learned")
    with pytest.raises(ValueError, match=r"interface\.lift: expected one of"):
        ModelConfig(interface={"name": "learned", "lift": "spiral"})


@pytest.mark.parametrize("name", ["learned", "canonical", "affine"])
def test_checkpoints_of_the_flat_format_still_load(tmp_path, name: str) -> None:
    """Checkpoints written before each interface had its own options hold all five fields, whatever the name."""
    import json

    from tablefree.checkpoint import load_model, save_model
    from tablefree.config import ModelConfig
    from tablefree.model import build_model

    model = build_model(
        ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64, interface=name)
    )
    save_model(tmp_path / "ck", model)
    saved = json.loads((tmp_path / "ck" / "config.json").read_text())
    flat = {"name": name, "lift": "tile", "values": "01", "bit_order": "lsb", "affine_seed": 0}
    saved["model"]["interface"] = flat
    (tmp_path / "ck" / "config.json").write_text(json.dumps(saved))
    loaded, _ = load_model(tmp_path / "ck")
    assert loaded.config.interface.name == name
    ids = torch.arange(300).view(3, 100)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model.eval()(ids))
