"""``tablefree eval``: zero-shot benchmarks and validation loss of a checkpoint (Python API:
``tablefree.evaluate.run_eval``)."""

from __future__ import annotations

import argparse

from tablefree.evaluate.evaluator import VALIDATION, format_results, run_eval
from tablefree.evaluate.spec import DEFAULT_TASKS, EvalSpec
from tablefree.evaluate.tasks import TASK_ALIASES, TASKS, parse_limit


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="zero-shot HellaSwag, PIQA, LAMBADA, ... and validation bits per byte, scored as lm-eval does",
        description="Score a checkpoint on zero-shot tasks with lm-evaluation-harness 0.4 semantics, and/or "
        "compute val_loss, val_ppl and bits_per_byte on a prepared dataset's val split. "
        "Python API: tablefree.evaluate.run_eval(EvalSpec(checkpoint, tasks, data_dir=..., limit=..., "
        "batch_size=..., device=..., examples_out=..., val_data=...)).",
    )
    parser.add_argument(
        "checkpoint", help="checkpoint directory, run directory, or directory of step_* checkpoints"
    )
    parser.add_argument(
        "--tasks",
        default=",".join(DEFAULT_TASKS),
        help=f"comma-separated, from {', '.join(TASKS)}, {VALIDATION}; or 'all' (aliases: "
        f"{', '.join(TASK_ALIASES)}); or a task file of your own, path/to/task.yaml (docs/evaluation.md, "
        "'Adding a task') (default: %(default)s)",
    )
    parser.add_argument(
        "--limit",
        type=limit_arg,
        default=None,
        metavar="N",
        help="first N >= 1 documents of each task (windows for validation); 'all' or leaving it out: the full "
        "sets; 0 is an error",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="packed rows per forward pass (default: %(default)s)"
    )
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--examples-out", default=None, help="write per-example records (JSONL) here")
    parser.add_argument(
        "--eval-data",
        default=None,
        help="benchmark files directory (default: $TABLEFREE_EVAL_DATA, then ~/.cache/tablefree/eval; "
        "fill it with `tablefree data download-evals DIR`)",
    )
    parser.add_argument("--val-data", default=None, help="prepared dataset directory for the validation task")
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer.json to use (must match the checkpoint's)"
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device, or auto for cuda when available (default: %(default)s)"
    )
    parser.add_argument(
        "--bootstrap-iters",
        type=int,
        default=100_000,
        help="bootstrap resamples for the perplexity standard error, as lm-eval (default: %(default)s; 0: none)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="forward-pass precision; auto: bf16 only where the device multiplies it natively and faster "
        "(as training's precision: auto; `tablefree hardware` shows the choice) (default: %(default)s)",
    )
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checkpoint's sha256 digests and finite-weights check (faster; printed when used)",
    )
    parser.set_defaults(func=run)


def limit_arg(text: str) -> int | None:
    try:
        return parse_limit(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if tasks == ["all"]:
        tasks = list(TASKS) + ([VALIDATION] if args.val_data else [])
    spec = EvalSpec(
        args.checkpoint,
        tasks,
        data_dir=args.eval_data,
        limit=args.limit,
        batch_size=args.batch_size,
        device=args.device,
        examples_out=args.examples_out,
        val_data=args.val_data,
        tokenizer=args.tokenizer,
        bootstrap_iters=args.bootstrap_iters,
        out=args.out,
        progress=args.progress,
        dtype=args.dtype,
        verify=not args.no_verify,
    )
    results = run_eval(spec)
    print(f"checkpoint: {results['checkpoint']}")
    print(format_results(results))
    if args.out:
        print(f"results written to {args.out}")
    return 0
