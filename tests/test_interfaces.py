from __future__ import annotations

import pytest
import torch

from tablefree.codes import AffineMap, ids_to_bits
from tablefree.interfaces import INTERFACES, build_interface, parse_interface_options
from tablefree.interfaces.options import InterfaceConfig


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


@pytest.mark.parametrize("values", ["01", "pm1"])
def test_scale_multiplies_every_input_value(values: str) -> None:
    ids = torch.arange(8).view(2, 4)
    plain = build_interface(opts(name="affine", values=values), 8, 6)(ids)
    scaled = build_interface(opts(name="affine", values=values, scale=0.25), 8, 6)(ids)
    assert plain.abs().max() == 1 and torch.equal(scaled, plain * 0.25)
    for bad, expected in ((0, "a positive number"), (-1.0, "a positive number"), (True, "a number")):
        with pytest.raises(ValueError, match=rf"interface\.scale: expected {expected}"):
            opts(name="canonical", scale=bad)


def test_affine_interface_matches_affine_map() -> None:
    config = opts(name="affine", seed=3)
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
    source = build_interface(opts(name="affine", seed=11), 500, 32)
    target = build_interface(opts(name="affine", seed=0), 500, 32)
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
        bits = AffineMap.from_seed(k, config.seed).encode(bits)
    values = bits[:, lift_index(k, d, config.lift)].float()
    return values * 2 - 1 if config.values == "pm1" else values


@pytest.mark.parametrize("name", ["canonical", "affine"])
@pytest.mark.parametrize("lift", ["tile", "interleave"])
@pytest.mark.parametrize("bit_order", ["lsb", "msb"])
@pytest.mark.parametrize("values", ["01", "pm1"])
def test_fast_path_matches_reference_construction(name: str, lift: str, bit_order: str, values: str) -> None:
    vocab, d = 3000, 50  # K = 12: two byte tables, d not a multiple of K
    config = opts(name=name, lift=lift, bit_order=bit_order, values=values, seed=5)
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
    config = opts(name=name, lift=lift, bit_order=bit_order, values=values, seed=1)
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
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64, interface="scratch")
    model = build_model(config, seed=0)
    codebook = model.input.codebook
    assert 0.95 < codebook.std().item() < 1.05  # its own N(0, 1), not init_std = 0.02
    assert torch.equal(codebook, scratch(opts(name="scratch"), 300, 32).codebook)
    assert abs(model.layers[0].mlp.w1.weight.std().item() - 0.02) < 0.003  # parameters still initialised


def test_a_new_interface_reloads_from_a_checkpoint_as_itself(scratch, tmp_path) -> None:
    from tablefree.checkpoint.model_dir import load_model, save_model
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64)
    config.interface = opts(name="scratch", scale=2.0)
    model = build_model(config, seed=1)
    save_model(tmp_path / "ck", model)
    loaded, _ = load_model(tmp_path / "ck")
    assert loaded.config.interface == opts(name="scratch", scale=2.0)
    assert torch.equal(loaded.input.codebook, model.input.codebook)


def test_options_parse_per_interface_with_errors_naming_the_field() -> None:
    from tablefree.model_config import ModelConfig

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

    from tablefree.checkpoint.model_dir import load_model, mark_complete, save_model
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    model = build_model(
        ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, d_ff=64, interface=name)
    )
    save_model(tmp_path / "ck", model)
    saved = json.loads((tmp_path / "ck" / "config.json").read_text())
    flat = {"name": name, "lift": "tile", "values": "01", "bit_order": "lsb", "seed": 0}
    saved["model"]["interface"] = flat
    (tmp_path / "ck" / "config.json").write_text(json.dumps(saved))
    mark_complete(tmp_path / "ck")  # as that version wrote it, whole
    loaded, _ = load_model(tmp_path / "ck")
    assert loaded.config.interface.name == name
    ids = torch.arange(300).view(3, 100)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model.eval()(ids))


# ----------------------------------------------------------------------------------------------------------
# The ablation interfaces (issue 14): gaussian, projected, wide-random, hashed

ALL = ["learned", "canonical", "affine", "gaussian", "projected", "wide-random", "hashed", "separable"]


def test_every_shipped_interface_is_registered() -> None:
    assert set(ALL) <= set(INTERFACES)


@pytest.mark.parametrize("name", [n for n in ALL if n != "hashed"])
def test_every_id_gets_a_distinct_row(name: str) -> None:
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    model = build_model(
        ModelConfig(vocab_size=3000, d_model=64, n_layers=1, n_heads=4, interface=name), seed=2
    )
    table = model.input.table()
    assert table.shape == (3000, 64)
    assert torch.unique(table, dim=0).shape[0] == 3000


def test_hashed_ids_collide_as_counted() -> None:
    interface = build_interface(opts(name="hashed", seed=4), 3000, 64)  # K = 12, K' = 10
    assert (interface.num_bits, interface.code_width) == (12, 10)
    table = interface.table()
    distinct_rows = torch.unique(table, dim=0).shape[0]
    codes = interface.code_bits(torch.arange(3000))
    packed = (codes << torch.arange(10)).sum(-1)
    assert distinct_rows == torch.unique(packed).numel() <= 1 << 10  # the lift keeps every code bit
    assert interface.collisions() == 3000 - distinct_rows >= 3000 - 1024
    assert torch.bincount(packed).max() <= 1 << (12 - 10)  # each code shared by at most 2^(K-K') ids
    with pytest.raises(ValueError, match=r"model.interface.bits: 12 bits must be from 1 to K - 1 = 11"):
        build_interface(opts(name="hashed", bits=12), 3000, 64)


@pytest.mark.parametrize("width", [13, 32, 64])
def test_wide_random_codes_are_distinct_by_construction(width: int) -> None:
    interface = build_interface(opts(name="wide-random", width=width, seed=1, lift="interleave"), 3000, 128)
    assert interface.code_width == width
    codes = interface.code_bits(torch.arange(3000))
    assert codes.shape == (3000, width)
    assert torch.unique(codes, dim=0).shape[0] == 3000
    assert 0.4 < codes.float().mean().item() < 0.6  # about half the bits set: random-looking, not the id
    assert torch.unique(interface.table(), dim=0).shape[0] == 3000


def test_wide_random_refuses_a_width_that_is_not_wider() -> None:
    with pytest.raises(ValueError, match=r"model.interface.width: 12 bits is not more than the K = 12 bits"):
        build_interface(opts(name="wide-random", width=12), 3000, 64)
    with pytest.raises(ValueError, match=r"model.interface.width: expected a number of bits from 2 to 64"):
        opts(name="wide-random", width=65)


def test_gaussian_is_a_stateless_function_of_seed_and_id() -> None:
    import math

    interface = build_interface(opts(name="gaussian", seed=5), 2000, 128)
    assert (
        list(interface.parameters()) == [] and list(interface.buffers()) == []
    )  # nothing V×d, nothing trained
    table = interface.table()
    assert abs(table.mean().item()) < 0.01
    assert abs(table.std().item() - 1 / math.sqrt(2)) < 0.01  # σ = 1/√2: E‖x‖² = d/2, as the {0,1} codes
    assert abs(table.pow(2).sum(1).mean().item() / 128 - 0.5) < 0.01
    ids = torch.tensor([[3, 1999, 0], [17, 3, 2]])
    assert torch.equal(interface(ids), table[ids])  # any id, any batch: the same row
    assert not torch.equal(build_interface(opts(name="gaussian", seed=6), 2000, 128).table(), table)
    scaled = build_interface(opts(name="gaussian", seed=5, sigma=2.0), 2000, 128).table()
    assert torch.allclose(scaled, table * 2 * math.sqrt(2), rtol=1e-5)
    with pytest.raises(ValueError, match=r"model.interface.sigma: expected a positive number"):
        opts(name="gaussian", sigma=0.0)


@pytest.mark.parametrize("code", ["canonical", "affine"])
def test_projected_is_the_code_times_a_trainable_map(code: str) -> None:
    from tablefree.codes import AffineMap, ids_to_bits

    interface = build_interface(opts(name="projected", code=code, seed=3, values="pm1"), 3000, 64)
    (weight,) = list(interface.parameters())
    assert weight.shape == (64, 12)  # K·d trainable parameters
    torch.nn.init.normal_(weight)
    bits = ids_to_bits(torch.arange(3000), 12)
    if code == "affine":
        bits = AffineMap.from_seed(12, 3).encode(bits)
    expected = (bits.float() * 2 - 1) @ weight.detach().T
    assert torch.allclose(interface.table(), expected, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_no_gradient_reaches_fixed_parts(name: str) -> None:
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    model = build_model(
        ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, interface=name), seed=0
    )
    ids = torch.randint(0, 300, (2, 8))
    model.loss(ids, ids).backward()
    trainable = {n for n, _ in model.input.named_parameters()}
    expected = {
        "learned": {"weight"},
        "projected": {"projection.weight"},
        "separable": {"codebooks.0", "codebooks.1"},
    }
    assert trainable == expected.get(name, set())
    for parameter in model.input.parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    for buffer in model.input.buffers():
        assert not buffer.requires_grad and buffer.grad is None


@pytest.mark.parametrize("name", ["gaussian", "wide-random", "hashed", "projected"])
def test_interface_seeds_follow_the_training_seed(name: str) -> None:
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    options = {"name": name, "code": "affine"} if name == "projected" else {"name": name}
    config = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, interface=options)
    one, two = build_model(config, seed=1), build_model(config, seed=2)
    assert one.config.interface.seed == 1 and two.config.interface.seed == 2
    if name != "projected":  # projected's table also depends on its trained map
        assert not torch.equal(one.input.table(), two.input.table())


def test_paper_preset_counts_of_every_interface() -> None:
    from tablefree.model_config import preset
    from tablefree.params import param_breakdown

    for name in ALL:
        b = param_breakdown(preset("paper-1.7b", interface=name))
        # separable: V = 49,152, s = ⌈√V⌉ = 222, rows 222 + ⌈49,152 / 222⌉ = 222, each d = 2,048 wide
        expected = {"learned": 100_663_296, "projected": 16 * 2048, "separable": 444 * 2048}.get(name, 0)
        assert b.input_interface == expected, name
        assert b.total_trainable == 1_711_376_384 + expected, name


@pytest.fixture(scope="module")
def markov_data(tmp_path_factory):
    from train_helpers import make_dataset

    return make_dataset(tmp_path_factory.mktemp("ablation") / "data")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gaussian", "projected", "wide-random", "hashed"])
def test_the_ablation_interfaces_train(tmp_path, markov_data, name: str) -> None:
    from tablefree.checkpoint.model_dir import load_model
    from tablefree.train.trainer import train
    from train_helpers import micro_config, train_losses

    run = tmp_path / "run"
    summary = train(micro_config(markov_data, budget="10 steps", **{"model.interface": name}), run)
    assert summary["completed"]
    losses = train_losses(run)
    first, last = losses[min(losses)], losses[max(losses)]
    assert last < first - 0.1, losses
    model, _ = load_model(run)
    assert model.config.interface.name == name


def test_gaussian_hash_is_lowbias32() -> None:
    """The int64 arithmetic (no overflow) computes Wellons' 32-bit hash exactly."""
    from tablefree.interfaces.gaussian import hash32

    def reference(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    values = [0, 1, 2, 12345, 0xFFFFFFFF, 0x80000000, *range(1000, 200_000, 997)]
    hashed = hash32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert hashed == [reference(v) for v in values]


@pytest.mark.parametrize("code", ["canonical", "affine"])
def test_projected_with_lift_init_starts_as_the_fixed_model(code: str) -> None:
    """``init: lift`` makes the projected model at step 0 the fixed-code model of the same seed, so a trained
    difference between the two is the trained map alone; the default init does not (its input starts small)."""
    from tablefree.model import TablefreeLM
    from tablefree.model_config import preset

    shape = dict(vocab_size=700, d_model=40, n_layers=1, n_heads=2, d_ff=64)
    ids = torch.randint(0, 700, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = {}
    for label, interface in {
        "fixed": {"name": code, "seed": 5},
        "lift": {"name": "projected", "code": code, "seed": 5, "init": "lift"},
        "normal": {"name": "projected", "code": code, "seed": 5},
    }.items():
        model = TablefreeLM(preset("tiny", interface=interface, **shape))
        model.init_weights(seed=3)
        logits[label] = model(ids)
        if label == "lift":
            weight = model.input.projection.weight
            assert weight.requires_grad and weight.sum().item() == 40  # one 1 per input dimension
            logits[label].sum().backward()
            assert weight.grad.abs().sum() > 0  # the map trains
    assert torch.equal(logits["lift"].detach(), logits["fixed"].detach())
    assert not torch.allclose(logits["normal"], logits["fixed"], atol=1e-3)
    with pytest.raises(ValueError, match=r"model\.interface\.init: expected one of"):
        opts(name="projected", init="identity")


def test_the_old_affine_seed_name_still_loads() -> None:
    """Configs and checkpoints written before the seed options had one name: ``affine_seed`` reads as ``seed``."""
    assert opts(name="affine", affine_seed=3) == opts(name="affine", seed=3)
    assert opts(name="projected", code="affine", affine_seed=2).seed == 2
    assert opts(name="affine", affine_seed=4, seed=4).seed == 4
    with pytest.raises(ValueError, match="'affine_seed' is the old name of 'seed'"):
        opts(name="affine", affine_seed=1, seed=2)


# ----------------------------------------------------------------------------------------------------------
# separable (issue 34): the id's mixed-radix digits, one small trainable codebook each

SEPARABLE_SHAPE = dict(vocab_size=300, d_model=38, n_layers=1, n_heads=1, d_ff=64)


@pytest.mark.parametrize(
    ("options", "rows", "widths"),
    [
        ({}, [18, 17], [38, 38]),  # s = ⌈√300⌉ = 18; the top digit takes ⌈300 / 18⌉ = 17 values
        ({"combine": "concat", "coordinates": 3}, [7, 7, 7], [13, 13, 12]),  # 7³ = 343 >= 300; 38 = 13+13+12
        ({"codebook_size": 25, "generator_hidden": 5}, [25, 12], [38, 38]),
    ],
)
def test_separable_rows_are_the_digits_codebooks_combined(options: dict, rows: list, widths: list) -> None:
    import math

    interface = build_interface(opts(name="separable", **options), 300, 38)
    assert (interface.rows, interface.widths) == (rows, widths)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in interface.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    s, c = interface.codebook_size, len(rows)
    books = [book.detach() for book in interface.codebooks]
    expected = []
    for t in range(300):
        digits = [(t // s**i) % s for i in range(c)]
        parts = [book[digit] for book, digit in zip(books, digits, strict=True)]
        if options.get("combine") == "concat":
            expected.append(torch.cat(parts))
        else:
            expected.append(sum(parts) / math.sqrt(c))
    expected = torch.stack(expected)
    if options.get("generator_hidden"):
        w1, w2 = interface.generator_in.weight.detach(), interface.generator_out.weight.detach()
        normed = expected / expected.pow(2).mean(1, keepdim=True).add(1e-6).sqrt()
        expected = expected + torch.nn.functional.gelu(normed @ w1.T) @ w2.T
    table = interface.table()
    assert torch.allclose(table, expected, atol=1e-5)
    assert torch.unique(table, dim=0).shape[0] == 300  # every id its own row
    ids = torch.tensor([[299, 0, 17], [18, 5, 299]])
    assert torch.allclose(interface(ids), table[ids], atol=1e-6)  # any batch: the same row


def test_separable_parameters_are_counted_exactly() -> None:
    from tablefree.model_config import ModelConfig
    from tablefree.params import param_breakdown

    body = param_breakdown(ModelConfig(**SEPARABLE_SHAPE, interface="canonical")).total_trainable
    for options, count in [
        ({}, (18 + 17) * 38),
        ({"combine": "concat"}, (18 + 17) * 19),
        ({"combine": "concat", "coordinates": 3}, 7 * 13 + 7 * 13 + 7 * 12),
        ({"codebook_size": 25, "generator_hidden": 5}, (25 + 12) * 38 + 2 * 38 * 5),
    ]:
        b = param_breakdown(ModelConfig(**SEPARABLE_SHAPE, interface={"name": "separable", **options}))
        assert b.input_interface == count == b.total_trainable - body, options
        interface = build_interface(opts(name="separable", **options), 300, 38)
        assert interface.num_parameters() == count  # the formula docs/models.md gives and describe() states


def test_separable_input_on_the_paper_config_is_at_most_an_eighth_of_the_table() -> None:
    from pathlib import Path

    from tablefree.params import param_breakdown
    from tablefree.train.recipe import load_train_config

    path = Path(__file__).resolve().parents[1] / "configs" / "paper-1.7b.yaml"
    vd = 49_152 * 2048
    for extra, count in [
        ([], 444 * 2048),
        (["model.interface.combine=concat"], 444 * 1024),
        (["model.interface.generator_hidden=1024"], 444 * 2048 + 2 * 2048 * 1024),
    ]:
        config = load_train_config(path, ["model.interface.name=separable", *extra]).model.build()
        b = param_breakdown(config)
        assert (config.vocab_size, config.d_model, b.interface) == (49_152, 2048, "separable")
        assert b.input_interface == count <= vd / 8, extra


@pytest.mark.parametrize("combine", ["sum", "concat"])
def test_separable_starts_at_the_learned_tables_scale(combine: str) -> None:
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    shape = dict(vocab_size=3000, d_model=64, n_layers=1, n_heads=4)
    learned = build_model(ModelConfig(**shape, interface="learned"), seed=0).input.table()
    options = {"name": "separable", "combine": combine}
    plain = build_model(ModelConfig(**shape, interface=options), seed=0).input.table()
    # each value N(0, init_std²), as a table's
    assert abs(plain.std().item() / learned.std().item() - 1) < 0.05
    assert abs(plain.mean().item()) < 0.002
    generated = build_model(ModelConfig(**shape, interface={**options, "generator_hidden": 16}), seed=0)
    # W₂ starts at zero: the generator starts as the identity
    assert torch.equal(generated.input.table(), plain)
    assert generated.input.generator_in.weight.std().item() > 0.015  # W₁ starts N(0, init_std), not zero


def test_separable_gradients_reach_each_ids_own_codebook_rows_and_the_generator() -> None:
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    config = ModelConfig(**SEPARABLE_SHAPE, interface={"name": "separable", "generator_hidden": 8})
    model = build_model(config, seed=0)
    ids = torch.randint(0, 150, (2, 8), generator=torch.Generator().manual_seed(1))  # not every digit value
    model.loss(ids, ids).backward()
    grads = {name: p.grad for name, p in model.input.named_parameters()}
    assert set(grads) == {"codebooks.0", "codebooks.1", "generator_in.weight", "generator_out.weight"}
    for i, digits in enumerate(model.input.digits(ids)):
        touched = torch.nonzero(grads[f"codebooks.{i}"].abs().sum(1)).flatten().tolist()
        assert touched == sorted(set(digits.flatten().tolist()))  # every used row, and only those
    assert grads["generator_out.weight"].abs().sum() > 0
    assert grads["generator_in.weight"].abs().sum() == 0  # W₂ = 0 at the start, so W₁ learns from step 2 on
    with torch.no_grad():
        model.input.generator_out.weight.sub_(0.01 * grads["generator_out.weight"].sign())
    model.zero_grad()
    model.loss(ids, ids).backward()
    assert model.input.generator_in.weight.grad.abs().sum() > 0


def test_separable_options_errors_name_the_field() -> None:
    from tablefree.model_config import ModelConfig

    for options, message in [
        ({"coordinates": 0}, r"interface\.coordinates: expected a number of coordinates >= 1, got 0"),
        ({"codebook_size": 1}, r"interface\.codebook_size: expected a codebook size >= 2, got 1"),
        ({"combine": "product"}, r"interface\.combine: expected one of \['sum', 'concat'\], got 'product'"),
        ({"generator_hidden": -4}, r"interface\.generator_hidden: expected a hidden width >= 0"),
        ({"codebook_size": "many"}, r"interface\.codebook_size"),
    ]:
        with pytest.raises(ValueError, match=message):
            ModelConfig(**SEPARABLE_SHAPE, interface={"name": "separable", **options})
    for options, d, message in [
        (
            {"codebook_size": 17},
            38,
            r"^model\.interface\.codebook_size: 2 coordinates of 17 values cover 17\^2 = 289 ids, fewer than "
            r"V = 300; use codebook_size >= 18",
        ),
        (
            {"codebook_size": 300, "coordinates": 3},
            38,
            r"^model\.interface\.codebook_size: 2 coordinates of 300 values already cover V = 300, so "
            r"coordinate 3 would always be 0",
        ),
        ({"coordinates": 10}, 38, r"^model\.interface\.coordinates: 10 coordinates .* use at most 9$"),
        (
            {"coordinates": 3, "combine": "concat"},
            2,
            r"^model\.interface\.combine: concat splits d_model = 2 among 3 coordinates",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            build_interface(opts(name="separable", **options), 300, d)


def test_separable_reloads_from_a_checkpoint_as_itself(tmp_path) -> None:
    from tablefree.checkpoint.model_dir import load_model, save_model
    from tablefree.model import build_model
    from tablefree.model_config import ModelConfig

    options = {"name": "separable", "combine": "concat", "coordinates": 3, "generator_hidden": 8}
    model = build_model(ModelConfig(**SEPARABLE_SHAPE, interface=options), seed=1)
    with torch.no_grad():
        model.input.generator_out.weight.normal_(0, 0.1)  # as after training: not the identity
    save_model(tmp_path / "ck", model)
    loaded, _ = load_model(tmp_path / "ck")
    assert loaded.config.interface == opts(**options)
    assert loaded.input.state_dict().keys() == model.input.state_dict().keys()
    for name, tensor in loaded.input.state_dict().items():
        assert torch.equal(tensor, model.input.state_dict()[name]), name
    ids = torch.arange(300).view(3, 100)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model.eval()(ids))


@pytest.mark.slow
def test_separable_trains_resumes_evaluates_analyses_and_exports_from_the_cli(tmp_path) -> None:
    """``tablefree train ... model.interface.name=separable`` and every verb after it, as a user runs them."""
    import json
    import math

    from tablefree.checkpoint.model_dir import load_model
    from tablefree.cli import main
    from train_helpers import make_dataset, micro_config, train_losses, write_config

    data = make_dataset(tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["val"]["document_starts"] = [0]  # one validation document (the evaluation reads them)
    (data / "manifest.json").write_text(json.dumps(manifest))
    config = write_config(tmp_path / "config.yaml", micro_config(data, budget="8 steps"))
    run = tmp_path / "run"
    interface = ["model.interface.name=separable", "model.interface.generator_hidden=8"]
    assert main(["train", "--config", str(config), "--run-dir", str(run), *interface]) == 0
    resume = ["train", "--run-dir", str(run), "--resume", "--allow-change", "budget", "budget=12 steps"]
    assert main(resume) == 0
    losses = train_losses(run)
    assert max(losses) == 12 and losses[12] < losses[min(losses)] - 0.1, losses
    model, _ = load_model(run)
    assert model.config.interface == opts(name="separable", generator_hidden=8)
    assert model.input.generator_out.weight.abs().sum() > 0  # the generator trained

    out = tmp_path / "eval.json"
    evaluate = ["eval", str(run), "--tasks", "validation", "--val-data", str(data), "--limit", "4"]
    assert main([*evaluate, "--out", str(out), "--device", "cpu"]) == 0
    assert math.isfinite(json.loads(out.read_text())["tasks"]["validation"]["metrics"]["val_loss"])
    assert main(["analyze", str(run), "--out", str(tmp_path / "analysis"), "--positions", "64"]) == 0
    assert json.loads((tmp_path / "analysis" / "analysis.json").read_text())["embeddings"]
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    back, _ = load_model(tmp_path / "back")
    assert back.config.interface == model.config.interface  # imported as itself, not as a learned table
