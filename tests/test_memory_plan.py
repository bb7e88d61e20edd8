"""The memory plan (``tablefree memory``, ``train.memory_plan``): the fake-tensor estimate against the peak a real
CPU step allocates, the FSDP accounting, the verdict and its fix, the CLI and the trainer's refusal.

The real peak is read from the CPU allocator's own reports (``torch.profiler`` with ``profile_memory``: every
allocation and free the c10 CPU allocator makes, in order, with its size). That counts every tensor a kernel
allocates, workspaces included, independently of MemTracker's dispatch-level view, and unlike RSS it does not
move with malloc's arenas and page reuse, so the comparison is deterministic."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tablefree.cli import main
from tablefree.config_parsing import parse_bytes
from tablefree.interfaces import ids_checked_by_caller
from tablefree.model import build_model
from tablefree.model_config import preset
from tablefree.train.memory_plan import (
    CATEGORIES,
    FLASH_ATTENTION_OP,
    LaunchShape,
    check_attention,
    estimate_memory,
    judge,
    trace_step,
)
from tablefree.train.optimizer import build_optimizer
from tablefree.train.parallelize import DistInfo, parallelize
from tablefree.train.recipe import TrainConfig
from train_helpers import make_dataset, micro_config

TOLERANCE = 0.15


def measured_peak(model_config, config: TrainConfig, shape: LaunchShape) -> int:
    """The peak bytes the CPU allocator holds over the same step on real tensors (one process, AdamW's moments
    already there as from the second step on): what is resident before the step plus the highest running total
    of the step's own allocations and frees."""
    device = torch.device("cpu")
    model = build_model(model_config, seed=0, device=device)
    train_model = parallelize(
        model, DistInfo(0, 0, 1, device), activation_checkpointing=shape.activation_checkpointing
    )
    optimizer = build_optimizer(model, config)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    resident = sum(t.untyped_storage().nbytes() for t in tensors)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=shape.precision == "bf16")
    generator = torch.Generator().manual_seed(0)
    micro_steps = min(shape.grad_accum, 2)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        for _ in range(micro_steps):
            size = (shape.micro_batch, shape.seq_len)
            inputs = torch.randint(0, model_config.vocab_size, size, generator=generator)
            targets = torch.randint(0, model_config.vocab_size, size, generator=generator)
            with autocast, ids_checked_by_caller():
                loss = train_model.loss(inputs, targets)
            (loss / micro_steps).backward()
            del loss, inputs, targets
        torch.nn.utils.clip_grad_norm_(train_model.parameters(), config.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    assert events and running == 0, "the step should free all it allocates (the moments were there before)"
    return resident + peak


def tiny(interface: str = "learned", **overrides):
    return preset("tiny", interface={"name": interface}, **overrides)


@pytest.mark.parametrize(
    "interface, layers, shape",
    [
        # deeper than the traced depths: extrapolated from 2 and 3 blocks
        ("learned", 5, LaunchShape(1, 4, 128, False, "fp32", "ddp", 2)),
        ("learned", 4, LaunchShape(1, 8, 128, True, "fp32", "ddp", 2)),
        ("canonical", 2, LaunchShape(1, 4, 256, False, "fp32", "ddp", 1)),
        ("affine", 4, LaunchShape(1, 4, 128, False, "bf16", "ddp", 2)),
    ],
)
def test_estimate_matches_the_peak_a_cpu_step_allocates(interface, layers, shape):
    model_config = tiny(interface, n_layers=layers)
    config = TrainConfig()
    estimate = estimate_memory(model_config, config, shape)
    measured = measured_peak(model_config, config, shape)
    assert abs(estimate.peak_bytes - measured) <= TOLERANCE * measured, (estimate.as_dict(), measured)
    assert estimate.peak_bytes == sum(getattr(estimate, name) for name in CATEGORIES)
    # the split: fp32 weights, their gradients (held into the second micro-step) and AdamW's two moments
    weights = sum(p.numel() for p in build_model(model_config, device="meta").parameters())
    assert estimate.parameters >= weights * 4
    assert estimate.optimizer_state >= weights * 8
    if shape.grad_accum > 1:
        assert estimate.gradients == weights * 4
    # the logits (B, T, V) are there at the peak, in the logits and loss, not in the activations
    assert estimate.logits_loss >= shape.micro_batch * shape.seq_len * model_config.vocab_size * 4


def test_extrapolated_depth_equals_the_full_trace():
    config, shape = TrainConfig(), LaunchShape(1, 2, 64, False, "fp32", "ddp", 2)
    full = trace_step(tiny(n_layers=6), config, shape)
    estimate = estimate_memory(tiny(n_layers=6), config, shape)
    assert estimate.traced_layers == (2, 3)
    assert {name: getattr(estimate, name) for name in CATEGORIES} == full[estimate.phase]


def test_checkpointing_keeps_fewer_activations():
    config = TrainConfig()
    plain = estimate_memory(tiny(n_layers=3), config, LaunchShape(1, 8, 256, False, "fp32", "ddp", 1))
    checkpointed = estimate_memory(tiny(n_layers=3), config, LaunchShape(1, 8, 256, True, "fp32", "ddp", 1))
    assert checkpointed.activations < plain.activations / 2


def test_fsdp_shards_the_state_and_adds_the_unsharded_layers():
    model_config, config = tiny(n_layers=3), TrainConfig()
    one = estimate_memory(model_config, config, LaunchShape(1, 2, 64, False, "bf16", "fsdp", 2))
    four = estimate_memory(model_config, config, LaunchShape(4, 2, 64, False, "bf16", "fsdp", 2))
    model = build_model(model_config, device="meta")
    weights = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.layers[0].parameters())
    root = weights - model_config.n_layers * block
    assert (one.parameters, one.gradients, one.optimizer_state) == (weights * 4, weights * 4, weights * 8)
    assert (four.parameters, four.gradients, four.optimizer_state) == (weights, weights, weights * 2)
    # an interface's fixed buffers are not sharded: every rank holds them whole
    affine = build_model(tiny("affine", n_layers=3), device="meta")
    fixed = estimate_memory(affine.config, config, four.shape)
    buffers = sum(b.numel() * b.element_size() for b in affine.buffers())
    assert buffers > 0 and fixed.parameters == sum(p.numel() for p in affine.parameters()) + buffers
    # activations and logits are per rank, the same at any world size
    assert (four.activations, four.logits_loss) == (one.activations, one.logits_loss)
    # the root group and two blocks unsharded in bf16, the root's and one block's gradients (bf16 + fp32 copy)
    assert four.transient >= (root + 2 * block) * 2 + root * 2 + block * 6
    # traced in bf16 with each gradient taken as it is reduced: no whole-model gradients in the transient
    assert four.transient < (root + 2 * block) * 2 + root * 2 + block * 6 + weights * 2


def test_ddp_over_several_gpus_counts_its_gradient_buckets():
    config = TrainConfig()
    one = estimate_memory(tiny(n_layers=2), config, LaunchShape(1, 2, 64, False, "fp32", "ddp", 2))
    two = estimate_memory(tiny(n_layers=2), config, LaunchShape(2, 2, 64, False, "fp32", "ddp", 2))
    assert two.gradients == 2 * one.gradients


def test_a_math_attention_trace_is_refused():
    check_attention({FLASH_ATTENTION_OP, "aten.mm.default"})
    with pytest.raises(RuntimeError, match="scores"):
        check_attention({"aten._safe_softmax.default", "aten.bmm.default"})


def test_verdict_keeps_headroom():
    estimate = estimate_memory(
        tiny(n_layers=2), TrainConfig(), LaunchShape(1, 2, 64, False, "fp32", "ddp", 1)
    )
    assert judge(estimate, estimate.peak_bytes * 2).fits
    assert not judge(
        estimate, estimate.peak_bytes
    ).fits  # no room left for the CUDA context and fragmentation


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("141GB") == 141 * 10**9
    assert parse_bytes("512") == 512
    for bad in ("80 gigs", "-1GB", "GB", "0"):
        with pytest.raises(ValueError, match="device-memory: expected a size"):
            parse_bytes(bad, "--device-memory")


@pytest.mark.slow  # the fix is searched: a trace per smaller micro-batch
def test_cli_json_names_the_peak_and_the_fix(capsys):
    assert main(["memory", "--preset", "tiny", "--micro-batch", "8", "--seq-len", "256", "--json",
                 "--precision", "fp32", "--device-memory", "64MiB"]) == 0  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert plan["peak_bytes"] == sum(plan[f"{name}_bytes"] for name in CATEGORIES)
    assert plan["shape"]["micro_batch"] == 8 and plan["verdict"]["fits"] is False
    assert "micro_batch=" in plan["verdict"]["fix"] or "activation_checkpointing" in plan["verdict"]["fix"]
    assert main(["memory", "--preset", "tiny", "--device-memory", "10GiB", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "verdict: fits" in out and "logits and loss" in out


def test_cli_without_a_gpu_gives_no_verdict(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["memory", "--preset", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] is None
    assert main(["memory", "--preset", "tiny", "--device-memory", "lots"]) == 1
    assert "--device-memory: expected a size" in capsys.readouterr().err


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("memory") / "data")


def test_train_refuses_a_launch_that_does_not_fit(data_dir, tmp_path):
    from tablefree.train.trainer import train

    config = micro_config(data_dir, device_memory="1MiB")
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"does not fit.*activations.*cheapest fix") as error:
        train(config, run_dir)
    assert "device_memory 1.0 MiB" in str(error.value)
    assert not (run_dir / "config.yaml").exists()  # refused before anything was written


def test_train_checks_only_what_it_is_asked_on_a_cpu(data_dir, tmp_path):
    from tablefree.train.trainer import train

    summary = train(replace(micro_config(data_dir), budget="2 steps"), tmp_path / "auto")
    assert summary["completed"]  # auto: no device memory known on a CPU, no check
    with pytest.raises(ValueError, match="device_memory: expected auto, off or a size"):
        micro_config(data_dir, device_memory="big")


def test_train_says_what_it_checked(data_dir, tmp_path, capsys):
    from tablefree.train.trainer import train

    train(micro_config(data_dir, budget="2 steps", device_memory="1GiB"), tmp_path / "fits")
    out = capsys.readouterr().out
    assert "memory plan: " in out and "per GPU estimated" in out and "usable of 1.00 GiB" in out


def test_a_torch_without_the_tracer_checks_nothing_unless_asked(monkeypatch, capsys):
    from tablefree.train import memory_plan

    monkeypatch.setattr(
        memory_plan, "tracer_available", lambda: (False, "torch 2.4's MemTracker has no _track")
    )
    assert memory_plan.device_memory_to_check("auto", torch.device("cuda")) is None
    assert "memory plan: not checked (torch 2.4" in capsys.readouterr().out
    with pytest.raises(ValueError, match="device_memory=80GiB: the memory plan cannot be traced here"):
        memory_plan.device_memory_to_check("80GiB", torch.device("cpu"))
    assert memory_plan.device_memory_to_check("auto", torch.device("cpu")) is None
    assert capsys.readouterr().out == ""  # nothing to check on a CPU unless asked: nothing said


def test_this_torch_has_the_tracer():
    from tablefree.train.memory_plan import tracer_available

    assert tracer_available() == (True, "MemTracker")
