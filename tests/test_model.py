from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tablefree.checkpoint.model_dir import load_model, save_model
from tablefree.interfaces import INTERFACES
from tablefree.model import KVCache, build_model
from tablefree.model_config import ModelConfig, preset
from tablefree.params import param_breakdown


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64)
    base.update(overrides)
    return ModelConfig(**base)


@pytest.mark.parametrize("interface", ["learned", "canonical", "affine"])
def test_exact_paper_counts(interface: str) -> None:
    b = param_breakdown(preset("paper-1.7b", interface=interface))
    expected = 1_812_039_680 if interface == "learned" else 1_711_376_384
    assert b.total_trainable == expected
    assert b.learned_total - 1_711_376_384 == 100_663_296


def test_earlier_study_table_size() -> None:
    learned = param_breakdown(preset("paper-32l-1024", interface="learned"))
    fixed = param_breakdown(preset("paper-32l-1024", interface="canonical"))
    assert learned.input_interface == 67_108_864
    assert learned.total_trainable - fixed.total_trainable == 67_108_864


@pytest.mark.parametrize(("name", "low", "high"), [("tiny", 1e6, 3e6), ("small", 10e6, 30e6)])
def test_cpu_preset_sizes(name: str, low: float, high: float) -> None:
    for interface in ("learned", "canonical"):
        assert low <= param_breakdown(preset(name, interface=interface)).total_trainable <= high


def test_params_cli_json() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tablefree.cli",
            "params",
            "--preset",
            "paper-1.7b",
            "--interface",
            "affine",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["total_trainable"] == 1_711_376_384
    assert data["removed_vs_learned"] == 100_663_296


def test_backbone_init_is_identical_across_interfaces() -> None:
    models = {
        name: build_model(tiny_config(interface={"name": name}), seed=5)
        for name in ("learned", "canonical", "affine")
    }
    reference = {k: v for k, v in models["learned"].state_dict().items() if not k.startswith("input.")}
    for name in ("canonical", "affine"):
        state = {k: v for k, v in models[name].state_dict().items() if not k.startswith("input.")}
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], reference[k]) for k in state), name
    other_seed = build_model(tiny_config(), seed=6)
    assert not torch.equal(other_seed.layers[0].attn.wq.weight, models["learned"].layers[0].attn.wq.weight)


def test_init_statistics() -> None:
    model = build_model(tiny_config(d_model=64, d_ff=256), seed=0)
    weight = model.layers[0].mlp.w1.weight
    assert abs(weight.std().item() - 0.02) < 0.002
    assert torch.equal(model.layers[0].attn_norm.weight, torch.ones(64))


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"mlp": "gelu", "norm": "layernorm"}])
def test_causality_and_shapes(overrides: dict) -> None:
    model = build_model(tiny_config(interface={"name": "canonical"}, **overrides), seed=0).eval()
    ids = torch.randint(0, 300, (2, 10))
    logits = model(ids)
    assert logits.shape == (2, 10, 300)
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 300
    logits2 = model(changed)
    assert torch.allclose(logits[:, :7], logits2[:, :7], atol=1e-6)
    assert not torch.allclose(logits[:, 7:], logits2[:, 7:])


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 1}])
def test_kv_cache_matches_full_forward(overrides: dict) -> None:
    model = build_model(tiny_config(interface={"name": "affine"}, **overrides), seed=1).eval()
    ids = torch.randint(0, 300, (3, 12))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache()
        first = model(ids[:, :5], cache=cache)
        second = model(ids[:, 5:9], cache=cache)
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(9, 12)]
    stitched = torch.cat([first, second, *steps], dim=1)
    assert torch.allclose(stitched, full, atol=1e-5)


def test_explicit_mask_and_positions_match_causal() -> None:
    model = build_model(tiny_config(), seed=2).eval()
    ids = torch.randint(0, 300, (1, 8))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    with torch.no_grad():
        assert torch.allclose(model(ids), model(ids, positions=torch.arange(8), mask=causal), atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}])
def test_outputs_at_chosen_positions_equal_the_full_forward_there(overrides: dict) -> None:
    """``hidden(outputs=...)`` skips the last block's work elsewhere; what it returns must not change: with the
    causal default, with an explicit (tree-shaped) mask and per-row positions, and after a cached prefix."""
    model = build_model(tiny_config(interface={"name": "affine"}, **overrides), seed=3).eval()
    ids = torch.randint(0, 300, (2, 9))
    outputs = torch.tensor([[8, 0, 3], [5, 5, 1]])
    rows = torch.arange(2).unsqueeze(1)
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 0, 1, 1, 2, 2, 2, -1, -1]])
    tree = torch.ones(9, 9, dtype=torch.bool).tril() & (
        (segments.unsqueeze(1) == 0) | (segments.unsqueeze(1) == segments.unsqueeze(2))
    )
    positions = torch.tensor([[0, 1, 2, 3, 4, 3, 4, 5, 6], [0, 1, 2, 3, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        full = model.hidden(ids)
        assert torch.allclose(model.hidden(ids, outputs=outputs), full[rows, outputs], atol=1e-5)
        full_tree = model.hidden(ids, positions=positions, mask=tree.unsqueeze(1))
        some_tree = model.hidden(ids, positions=positions, mask=tree.unsqueeze(1), outputs=outputs)
        assert torch.allclose(some_tree, full_tree[rows, outputs], atol=1e-5)
        assert not torch.allclose(
            full_tree[rows, outputs], full[rows, outputs], atol=1e-3
        )  # the mask mattered
        cache = KVCache()
        model.hidden(ids[:, :4], cache=cache)
        after_prefix = model.hidden(ids[:, 4:], cache=cache, outputs=torch.tensor([[4, 0], [2, 2]]))
    assert torch.allclose(after_prefix, full[rows, torch.tensor([[8, 4], [6, 6]])], atol=1e-5)
    # a model with no blocks has no last block to select the outputs in
    no_blocks = build_model(tiny_config(n_layers=0, **overrides), seed=3).eval()
    with torch.no_grad():
        assert torch.equal(no_blocks.hidden(ids, outputs=outputs), no_blocks.hidden(ids)[rows, outputs])


def test_loss_backward_skips_fixed_interface() -> None:
    model = build_model(tiny_config(interface={"name": "canonical"}), seed=0)
    ids = torch.randint(0, 300, (2, 8))
    model.loss(ids, ids).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert list(model.input.parameters()) == []


@pytest.mark.parametrize("interface", ["learned", "affine"])
def test_checkpoint_round_trip(tmp_path, interface: str) -> None:
    model = build_model(tiny_config(interface={"name": interface, "seed": 4}), seed=3).eval()
    save_model(tmp_path / "checkpoints" / "step_00000002", model, meta={"step": 2})
    (tmp_path / "checkpoints" / "step_00000003").mkdir()  # incomplete: no marker, must be skipped
    loaded, directory = load_model(tmp_path)  # a run directory resolves to its newest complete checkpoint
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    assert directory == tmp_path / "checkpoints" / "step_00000002"


@pytest.mark.parametrize("interface", sorted(INTERFACES))
def test_every_interface_loads_back_exactly(tmp_path, interface: str) -> None:
    """load_model recomputes only the fixed codes (no random weights drawn): every buffer and output must come
    back exactly, whatever the interface keeps out of the weights file."""
    model = build_model(tiny_config(interface={"name": interface}), seed=3).eval()
    save_model(tmp_path / "checkpoint", model, meta={"step": 0})
    loaded, _ = load_model(tmp_path / "checkpoint")
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    saved_buffers, loaded_buffers = dict(model.named_buffers()), dict(loaded.named_buffers())
    assert saved_buffers.keys() == loaded_buffers.keys()
    assert all(torch.equal(saved_buffers[name], loaded_buffers[name]) for name in saved_buffers)


def test_seed_follows_the_training_seed_unless_held() -> None:
    from tablefree.codes import AffineMap, num_bits

    k = num_bits(300)
    follows = build_model(tiny_config(interface={"name": "affine"}), seed=3)
    assert follows.config.interface.seed == 3  # recorded in the model config that checkpoints save
    assert torch.equal(follows.input.affine_matrix, AffineMap.from_seed(k, 3).matrix)
    other = build_model(tiny_config(interface={"name": "affine"}), seed=4)
    assert not torch.equal(other.input.affine_matrix, follows.input.affine_matrix)
    held = build_model(tiny_config(interface={"name": "affine", "seed": 7}), seed=3)
    assert held.config.interface.seed == 7
    assert torch.equal(held.input.affine_matrix, AffineMap.from_seed(k, 7).matrix)


def test_model_spec_resolves_the_seed_from_the_training_seed() -> None:
    from tablefree.train.recipe import load_train_config

    config = load_train_config(None, ["model.interface.name=affine", "seed=5"])
    assert config.model.build(300, seed=config.seed).interface.seed == 5
    held = load_train_config(None, ["model.interface.name=affine", "model.interface.seed=2", "seed=5"])
    assert held.model.build(300, seed=held.seed).interface.seed == 2


def test_checkpoint_records_the_resolved_seed(tmp_path) -> None:
    from tablefree.checkpoint.model_dir import read_model_config

    model = build_model(tiny_config(interface={"name": "affine"}), seed=9)
    save_model(tmp_path / "ck", model)
    assert read_model_config(tmp_path / "ck").interface.seed == 9
    loaded, _ = load_model(tmp_path / "ck")
    assert torch.equal(loaded.input.affine_matrix, model.input.affine_matrix)


def test_params_cli_all_interfaces_and_options() -> None:
    import contextlib
    import io

    from tablefree.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["params", "--preset", "paper-1.7b", "--interface", "all", "--json"]) == 0
    rows = {row["interface"]: row for row in json.loads(out.getvalue())}
    assert rows["projected"]["input_interface"] == 32_768
    assert rows["learned"]["total_trainable"] == 1_812_039_680
    assert rows["gaussian"]["total_trainable"] == rows["hashed"]["total_trainable"] == 1_711_376_384
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = ["params", "--preset", "tiny", "--interface", "projected", "--option", "code=affine", "--json"]
        assert main(args) == 0
    assert json.loads(out.getvalue())["input_interface"] == 12 * 128
    assert main(["params", "--preset", "tiny", "--interface", "affine", "--option", "lfit=tile"]) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.interface.seed=3", "model.interface=affine"],
        ["model.interface=affine", "model.interface.seed=3"],
    ],
)
def test_interface_overrides_in_either_order(overrides: list[str]) -> None:
    from tablefree.train.recipe import load_train_config

    config = load_train_config(None, overrides)
    assert config.model.interface.name == "affine" and config.model.interface.seed == 3
    assert config.model.build(300, seed=0).interface.seed == 3


def test_unknown_interface_on_the_command_line_names_the_override() -> None:
    from tablefree.train.recipe import load_train_config

    with pytest.raises(
        ValueError, match=r"'model.interface=canonicl'.*model.interface.name: unknown interface"
    ):
        load_train_config(None, ["model.interface=canonicl"])
