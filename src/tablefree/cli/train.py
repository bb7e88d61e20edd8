"""``tablefree train``: train a model from a YAML recipe (Python API: ``tablefree.train.trainer.train``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from tablefree.checkpoint.layout import has_checkpoints
from tablefree.config_parsing import from_dict_with_overrides, to_dict
from tablefree.data.loader import Dataset, TokenLoader
from tablefree.data.verify import verify_dataset
from tablefree.params import param_breakdown
from tablefree.rundir import SWEEP_CONFIG
from tablefree.train.recipe import TrainConfig, load_train_config, plan


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model from a YAML recipe (single process, or DDP/FSDP2 under torchrun)",
        description="Train a model from a YAML recipe with dotted overrides, e.g. "
        "`tablefree train --config configs/tiny.yaml model.interface=affine optim.lr=1e-3`. "
        "Under `torchrun --nproc_per_node N` the same command trains with DDP or FSDP2 (parallel=ddp|fsdp). "
        "Python API: tablefree.train.trainer.train(tablefree.train.recipe.load_train_config(PATH, "
        "OVERRIDES), RUN_DIR, resume=False, allow_change=()). See docs/training.md.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML recipe (default with --resume: the run's recorded recipe, RUN_DIR/config.yaml plus the "
        "changes allowed since; else the built-in defaults)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. seed=1")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where config.yaml, metrics.jsonl, summary.json and checkpoints/ go "
        "(default: runs/<config name>-<interface>-seed<seed>)",
    )
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its newest checkpoint that loads, with its recorded recipe "
        "(an error when there is nothing to resume)",
    )
    resume.add_argument(
        "--resume-if-present",
        action="store_true",
        help="resume when --run-dir holds a checkpoint, else start the run (what `tablefree compare` uses)",
    )
    parser.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="FIELD",
        help="with --resume: let this recipe field (e.g. optim.lr, budget; a section name covers its fields) "
        "differ from the recorded one; recorded in RUN_DIR/config_changes.json. Repeatable",
    )
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s per device for MFU (overrides the table)"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="check everything training would read (dataset, shards, run directory, model, step plan), then "
        "print the resolved config and the derived plan and exit",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tablefree.train.resume import CONFIG_FILE, nothing_to_resume, recorded_config
    from tablefree.train.trainer import train

    config_path = args.config
    overrides = list(args.overrides)
    if args.peak_flops is not None:
        overrides.append(f"peak_flops={args.peak_flops}")
    resume = "auto" if args.resume_if_present else args.resume
    if resume and args.run_dir is not None and (args.run_dir / SWEEP_CONFIG).exists():
        raise FileNotFoundError(
            f"--run-dir {args.run_dir} is a sweep directory ({SWEEP_CONFIG}), not a run: resume the sweep by "
            f"re-running its `tablefree compare` command, or name one of its runs, {args.run_dir}/runs/NAME"
        )
    if config_path is None and resume and args.run_dir is not None:
        # continue a run with the recipe it recorded (config.yaml plus the changes allowed since)
        recipe = recorded_config(args.run_dir)
        if recipe is None and args.resume:
            raise FileNotFoundError(nothing_to_resume(args.run_dir))
        config = load_recorded_config(recipe, overrides, args.run_dir / CONFIG_FILE) if recipe else None
    else:
        config = None
    if config is None:
        config = load_train_config(config_path, overrides)  # no --config: the defaults plus the overrides
    name = config_path.stem if config_path is not None else "default"
    run_dir = args.run_dir or Path("runs") / f"{name}-{config.model.interface.name}-seed{config.seed}"
    if args.print_config:
        # Check all of it before printing anything, as training would: the dataset and its shards, the run
        # directory, and building the model on the meta device (the interface and its options) at no cost.
        model_config, run_plan, parameters = check_before_training(config, run_dir, resume, args.allow_change)
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        print(f"# plan (one process): {run_plan}")
        print(f"# trainable parameters: {parameters:,} (vocabulary {model_config.vocab_size:,})")
        print(f"# run dir: {run_dir}")
        return 0
    if args.allow_change and not resume:
        raise ValueError("--allow-change: only with --resume (a new run takes its recipe as given)")
    summary = train(config, run_dir, resume=resume, allow_change=args.allow_change)
    return 0 if summary["completed"] or summary["stop_reason"].startswith("stopped by") else 1


def load_recorded_config(recipe: dict, overrides: list[str], where: Path):
    """A TrainConfig from a run's recorded recipe (a dict) and command-line overrides."""
    return from_dict_with_overrides(TrainConfig, recipe, overrides, str(where))


def check_before_training(config, run_dir: Path, resume: bool | str, allow_change: list[str]):
    """What ``--print-config`` checks, every file training would read: the dataset's manifest, its shards
    against it (sizes; sha256 when small, as the trainer does) and enough tokens per split for a window, the
    run directory (a run to resume, or none to overwrite), the model and the step plan. Returns (model config,
    plan, trainable parameters); raises as training would."""
    from tablefree.train.resume import check_resumable, nothing_to_resume, verify_dataset_matches_run

    dataset = Dataset.open(config.data.dir)
    manifest = dataset.manifest
    check = verify_dataset(config.data.dir, hashes="auto")
    if not check.ok:
        raise ValueError(f"data.dir {'; '.join([check.format().splitlines()[0], *check.problems])}")
    model_config = config.model.build(manifest["vocab_size"])
    parameters = param_breakdown(model_config).total_trainable
    run_plan = plan(config, model_config)
    for split in ("train", "val"):
        TokenLoader.from_dir(config.data.dir, split, run_plan.seq_len, config.micro_batch)
    resuming = resume is True or (resume == "auto" and has_checkpoints(run_dir))
    if resume is True and not has_checkpoints(run_dir):
        raise FileNotFoundError(nothing_to_resume(run_dir))
    if resuming:
        verify_dataset_matches_run(run_dir, dataset)
        check_resumable(run_dir, config, allow_change)
    elif has_checkpoints(run_dir):
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it, or choose another --run-dir"
        )
    return model_config, run_plan, parameters
