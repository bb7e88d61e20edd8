"""``tablefree train``: train a model from a YAML recipe (Python API: ``tablefree.train.trainer.train``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model from a YAML recipe (single process, or DDP/FSDP2 under torchrun)",
        description="Train a model from a YAML recipe with dotted overrides, e.g. "
        "`tablefree train --config configs/tiny.yaml model.interface=affine optim.lr=1e-3`. "
        "Under `torchrun --nproc_per_node N` the same command trains with DDP or FSDP2 (parallel=ddp|fsdp). "
        "Python API: tablefree.train.trainer.train(tablefree.train.config.load_train_config(PATH, "
        "OVERRIDES), RUN_DIR, resume=False). See docs/training.md.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML recipe (default: RUN_DIR/config.yaml with --resume, else the built-in defaults)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. seed=1")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where config.yaml, metrics.jsonl, summary.json and checkpoints/ go "
        "(default: runs/<config name>-<interface>-seed<seed>)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint in the run dir"
    )
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s per device for MFU (overrides the table)"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the config and the derived plan, then exit"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tablefree.config import to_dict
    from tablefree.data.loader import read_manifest
    from tablefree.train.config import load_train_config, plan
    from tablefree.train.trainer import CONFIG_FILE, train

    config_path = args.config
    if config_path is None and args.resume and args.run_dir is not None:
        config_path = args.run_dir / CONFIG_FILE  # continue a run with the config it recorded
    overrides = list(args.overrides)
    if args.peak_flops is not None:
        overrides.append(f"peak_flops={args.peak_flops}")
    config = load_train_config(config_path, overrides)  # no --config: the defaults plus the overrides
    name = config_path.stem if config_path is not None else "default"
    run_dir = args.run_dir or Path("runs") / f"{name}-{config.model.interface.name}-seed{config.seed}"
    if args.print_config:
        import yaml

        from tablefree.params import param_breakdown

        try:
            vocab = read_manifest(config.data.dir)["vocab_size"]
        except FileNotFoundError:  # not prepared yet: show the plan with the preset's vocabulary
            vocab = None
        model_config = config.model.build(vocab)
        # Validate all of it before printing anything: building the model on the meta device checks the
        # interface and its options exactly as training would, at no cost.
        parameters = param_breakdown(model_config).total_trainable
        run_plan = plan(config, model_config)
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        print(f"# plan (one process): {run_plan}")
        print(f"# trainable parameters: {parameters:,} (vocabulary {model_config.vocab_size:,})")
        print(f"# run dir: {run_dir}")
        return 0
    summary = train(config, run_dir, resume=args.resume)
    return 0 if summary["completed"] or summary["stop_reason"].startswith("stopped by") else 1
