"""Training config: parsing, validation, schedules, optimizer groups, FLOPs accounting and the shipped recipes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tablefree.model import build_model
from tablefree.model_config import preset
from tablefree.train.metrics import flops_per_token
from tablefree.train.optimizer import build_optimizer
from tablefree.train.recipe import ScheduleConfig, TrainConfig, load_train_config, lr_at, parse_budget, plan
from train_helpers import make_dataset, micro_config

REPO = Path(__file__).resolve().parents[1]


def test_yaml_with_dotted_overrides(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {preset: small, interface: {name: learned, lift: interleave}}\nbudget: 100B\n")
    config = load_train_config(
        path, ["model.interface.name=affine", "optim.lr=3e-4", "seed=7", "model.d_model=192"]
    )
    assert config.model.interface.name == "affine" and config.model.interface.lift == "interleave"
    assert config.optim.lr == 3e-4 and config.seed == 7
    assert parse_budget(config.budget) == ("tokens", 100_000_000_000)
    assert config.model.build(dataset_vocab_size=1000).d_model == 192
    # a bare interface name replaces the whole interface section
    assert load_train_config(path, ["model.interface=canonical"]).model.interface.name == "canonical"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100B", ("tokens", 10**11)),
        (2048, ("tokens", 2048)),
        ("2.5M", ("tokens", 2_500_000)),
        ("500 steps", ("steps", 500)),
        ("1step", ("steps", 1)),
    ],
)
def test_budget(text, expected) -> None:
    assert parse_budget(text) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["budget=lots"], "budget"),
        (["optim.betas=[0.9]"], "optim.betas"),
        (["schedule.name=linear"], "schedule.name"),
        (["precision=fp16"], "precision"),
        (["optim.lrr=1"], "lrr"),
        (["model.preset=huge"], "model.preset"),
    ],
)
def test_bad_fields_are_named(tmp_path, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_train_config(None, overrides)


def test_plan_derives_grad_accum_and_names_fields_on_indivisible_batches() -> None:
    model = preset("tiny", vocab_size=100)
    config = load_train_config(None, ["batch_tokens=8192", "micro_batch=4", "seq_len=256", "budget=1M"])
    p = plan(config, model, world_size=2)
    assert (p.grad_accum, p.total_steps) == (4, math.ceil(1_000_000 / 8192))
    assert plan(config, model, world_size=1).grad_accum == 8
    with pytest.raises(
        ValueError, match=r"batch_tokens \(8192\).*seq_len \(256\).*micro_batch \(4\).*world_size \(3\)"
    ):
        plan(config, model, world_size=3)
    with pytest.raises(ValueError, match=r"exceeds model\.max_seq_len"):
        plan(load_train_config(None, ["seq_len=512"]), model)
    assert (
        plan(
            load_train_config(None, ["budget=10 steps", "batch_tokens=1024", "micro_batch=4"]), model
        ).total_steps
        == 10
    )


def test_vocab_comes_from_the_dataset_and_an_explicit_mismatch_is_an_error() -> None:
    assert (
        load_train_config(None, ["model.preset=small"]).model.build(dataset_vocab_size=321).vocab_size == 321
    )
    config = load_train_config(None, ["model.vocab_size=4096"])
    assert config.model.build(dataset_vocab_size=4096).vocab_size == 4096
    with pytest.raises(ValueError, match=r"model.vocab_size is 4096.*300 tokens"):
        config.model.build(dataset_vocab_size=300)


def test_warmup_then_cosine_by_hand() -> None:
    schedule = ScheduleConfig(name="cosine", warmup_steps=10, min_lr=0.1)
    assert lr_at(1, 110, 1.0, schedule) == pytest.approx(0.1)
    assert lr_at(5, 110, 1.0, schedule) == pytest.approx(0.5)
    assert lr_at(10, 110, 1.0, schedule) == pytest.approx(1.0)
    assert lr_at(60, 110, 1.0, schedule) == pytest.approx(0.55)  # half way: (1 + 0.1) / 2
    assert lr_at(35, 110, 1.0, schedule) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr_at(110, 110, 1.0, schedule) == pytest.approx(0.1)


def test_warmup_stable_decay_by_hand() -> None:
    schedule = ScheduleConfig(name="wsd", warmup_steps=10, decay_fraction=0.2, min_lr=0.0)
    assert lr_at(5, 100, 2.0, schedule) == pytest.approx(1.0)
    assert [lr_at(s, 100, 2.0, schedule) for s in (10, 11, 50, 80)] == [2.0, 2.0, 2.0, 2.0]
    assert lr_at(90, 100, 2.0, schedule) == pytest.approx(1.0)  # half way through the 20 decay steps
    assert lr_at(100, 100, 2.0, schedule) == pytest.approx(0.0)
    assert lr_at(7, 100, 2.0, ScheduleConfig(name="constant")) == 2.0


def test_weight_decay_groups() -> None:
    config = TrainConfig()
    model = build_model(preset("tiny", vocab_size=64, d_model=32, n_heads=2, d_ff=64, n_layers=1))
    decay, no_decay = build_optimizer(model, config).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {n for n in not_decayed if "norm" in n} == {n for n in names.values() if "norm" in n}
    assert "input.weight" in not_decayed and "head.weight" in decayed and "layers.0.attn.wq.weight" in decayed
    config.optim.decay_embeddings = True
    decay, _ = build_optimizer(model, config).param_groups
    assert any(p is model.input.weight for p in decay["params"])


def test_flops_per_token_is_torchtitans_and_equal_across_interfaces() -> None:
    learned = preset("small", interface="learned", vocab_size=8192)
    canonical = preset("small", interface="canonical", vocab_size=8192)
    d, L, V, ff = 384, 6, 8192, 1024
    non_embedding = (
        L * (4 * d * d + 3 * d * ff + 2 * d) + d + V * d
    )  # attention, swiglu, norms, final norm, head
    assert flops_per_token(learned, 512) == 6 * non_embedding + 12 * L * 6 * 64 * 512
    assert flops_per_token(canonical, 512) == flops_per_token(learned, 512)


@pytest.mark.parametrize(
    ("name", "world_size"), [("tiny", 1), ("small", 1), ("paper-1.7b", 8), ("paper-32l-1024", 8)]
)
def test_shipped_recipes_load_and_plan(name, world_size) -> None:
    config = load_train_config(REPO / "configs" / f"{name}.yaml")
    p = plan(config, config.model.build(), world_size)
    assert p.total_steps > 0 and p.grad_accum >= 1
    papers_budget = {"paper-1.7b": 100_000_000_000, "paper-32l-1024": 17_000_000_000}  # each study's own
    if name in papers_budget:
        assert parse_budget(config.budget) == ("tokens", papers_budget[name])


def test_micro_config_is_valid(tmp_path) -> None:
    config = micro_config(make_dataset(tmp_path / "data"))
    assert plan(config, config.model.build(96)).grad_accum == 2
    assert torch.get_num_threads() >= 1
