"""FSDP2's meta-device build: each rank materialises only its shards, yet the weights equal an unsharded
``build_model`` with the same seed (every interface, fixed buffers recomputed after ``to_empty``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tablefree import build_model
from tablefree.interfaces import INTERFACES
from tablefree.model_config import preset
from tablefree.train.parallelize import (
    destroy_distributed,
    init_distributed,
    parallelize,
    unwrapped_name,
)
from train_helpers import cli_env

WORKER = Path(__file__).with_name("meta_build_worker.py")
CONFIG = dict(n_layers=2, d_model=64, n_heads=2, d_ff=96, vocab_size=1001)  # as in meta_build_worker.py


def sharded_build(tmp_path: Path, processes: int, interface: str, seed: int) -> dict:
    out = tmp_path / f"{interface}-{processes}.pt"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
        "--standalone", str(WORKER), str(out), interface, str(seed),
    ]  # fmt: skip
    result = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return torch.load(out, weights_only=True)


def assert_same_as_unsharded(built: dict, interface: str | dict, seed: int) -> None:
    reference = build_model(preset("tiny", interface=interface, **CONFIG), seed=seed)
    expected = reference.state_dict()
    assert sorted(built["weights"]) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(built["weights"][name], tensor), name
    expected_buffers = dict(reference.named_buffers())
    assert sorted(built["buffers"]) == sorted(expected_buffers)
    for name, tensor in expected_buffers.items():
        assert torch.equal(built["buffers"][name], tensor), name


@pytest.fixture
def process_group(monkeypatch):
    """A one-process gloo group in this process (FSDP2 needs one even on a single device), on the private
    in-memory rendezvous a process outside torchrun gets (no rendezvous variables: monkeypatch removes any)."""
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    info = init_distributed("cpu", force_process_group=True)
    yield info
    destroy_distributed()


def in_process_build(info, interface: str | dict, seed: int) -> dict:
    model = build_model(preset("tiny", interface=interface, **CONFIG), seed=seed, device="meta")
    model = parallelize(model, info, parallel="fsdp", activation_checkpointing=True, seed=seed)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    buffers = {unwrapped_name(name): b for name, b in model.named_buffers()}
    return {"weights": get_model_state_dict(model, options=options), "buffers": buffers}


@pytest.mark.parametrize("interface", sorted(INTERFACES))
def test_meta_build_on_one_process_equals_the_unsharded_build(process_group, interface) -> None:
    assert_same_as_unsharded(in_process_build(process_group, interface, seed=3), interface, seed=3)


def test_meta_build_starts_an_interface_parameter_with_its_own_init(process_group) -> None:
    """``projected``'s ``init: lift`` (``InputInterface.init_parameter``) also holds for the sharded build."""
    interface = {"name": "projected", "init": "lift"}
    built = in_process_build(process_group, interface, seed=3)
    assert_same_as_unsharded(built, interface, seed=3)
    weight = built["weights"]["input.projection.weight"]
    assert weight.sum().item() == weight.shape[0] and set(weight.unique().tolist()) == {0.0, 1.0}


def test_a_different_seed_gives_different_weights(process_group) -> None:
    """The comparison above can fail: the materialised weights really follow the seed."""
    built = in_process_build(process_group, "canonical", seed=4)
    reference = build_model(preset("tiny", interface="canonical", **CONFIG), seed=5).state_dict()
    assert not torch.equal(built["weights"]["head.weight"], reference["head.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("interface", ["learned", "canonical", "affine"])
def test_meta_build_sharded_over_two_processes_equals_the_unsharded_build(tmp_path, interface) -> None:
    assert_same_as_unsharded(sharded_build(tmp_path, 2, interface, seed=5), interface, seed=5)
