"""``tablefree memory``: the per-GPU memory plan of a launch, before it is launched (Python API:
``tablefree.train.memory_plan.plan_memory``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tablefree.config_parsing import parse_bytes
from tablefree.fileio import read_json
from tablefree.train.recipe import load_train_config


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "memory",
        help="the per-GPU peak memory of a launch, and whether it fits the device (a fake-tensor trace)",
        description="Estimate the per-GPU peak of one training step of a recipe (--config) or a preset (--preset) "
        "at a launch shape, split into parameters, gradients, optimizer state, activations, logits and loss and "
        "the transient, by running the real step on fake tensors under MemTracker (no memory, no GPU needed), "
        "and say whether it fits the device memory. Shape options left out take the recipe's values. See "
        "docs/distributed.md#memory-plan. Python API: tablefree.train.memory_plan.plan_memory(MODEL_CONFIG, "
        "TRAIN_CONFIG, tablefree.train.memory_plan.LaunchShape(...), DEVICE_MEMORY_BYTES).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="a training recipe (YAML)")
    source.add_argument("--preset", help="a model preset, planned with the default recipe")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted recipe overrides")
    parser.add_argument(
        "--gpus", type=int, default=1, help="processes (GPUs) the run is launched on (default 1)"
    )
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per GPU per micro-step")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    parser.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="recompute each block in the backward (default: the recipe's)",
    )
    parser.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default=None,
        help="compute precision (default: the recipe's; its auto is bf16, what it picks on a GPU with native bf16)",
    )
    parser.add_argument("--parallel", choices=["ddp", "fsdp"], default=None, help="default: the recipe's")
    parser.add_argument(
        "--device-memory",
        default=None,
        help="the memory of one GPU, e.g. 80GiB or 141GB (default: the visible GPU's; without one, no verdict)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the peak under peak_bytes)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tablefree.train.memory_plan import launch_shape, plan_memory, visible_device_memory

    overrides = list(args.overrides)
    if args.preset is not None:
        overrides.insert(0, f"model.preset={args.preset}")
    for flag, key in (
        (args.micro_batch, "micro_batch"),
        (args.seq_len, "seq_len"),
        (args.activation_checkpointing, "activation_checkpointing"),
        (args.parallel, "parallel"),
    ):
        if flag is not None:
            overrides.append(f"{key}={str(flag).lower() if isinstance(flag, bool) else flag}")
    if args.gpus < 1:
        raise ValueError(f"--gpus: expected a positive number, got {args.gpus}")
    config = load_train_config(args.config, overrides)
    manifest = Path(config.data.dir) / "manifest.json" if config.data.dir else None
    vocab_size = read_json(manifest)["vocab_size"] if manifest is not None and manifest.is_file() else None
    model_config = config.model.build(dataset_vocab_size=vocab_size, seed=config.seed)
    precision = args.precision or ("fp32" if config.precision == "fp32" else "bf16")
    # a preset has no batch of its own: plan it with gradient accumulation, the larger of the two peaks
    shape = launch_shape(config, model_config, args.gpus, precision, 2 if args.config is None else None)
    device_memory = (
        parse_bytes(args.device_memory, "--device-memory")
        if args.device_memory is not None
        else visible_device_memory()
    )
    name = args.config.name if args.config is not None else f"preset {args.preset}"
    name += f" ({model_config.interface.name}, vocabulary {model_config.vocab_size:,}"
    name += ", the dataset's)" if vocab_size is not None else ", the preset's)"
    memory_plan = plan_memory(model_config, config, shape, device_memory, name)
    if args.json:
        print(json.dumps(memory_plan.as_dict(), indent=2))
    else:
        print(memory_plan.format())
    return 0
