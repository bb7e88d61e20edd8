"""``tablefree demo``: the three-interface experiment on the embedded default corpus, offline, in minutes on a
CPU (timings in docs/demo.md; Python API: ``tablefree.demo.run_demo``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tablefree.cli.compare import parse_interfaces, parse_seeds
from tablefree.cli.eval import limit_arg


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole experiment on the embedded default corpus, offline, in minutes on a CPU (see docs/demo.md)",
        description="Gather English documentation text shipped with Python and PyTorch (or use --corpus), train a "
        "tokenizer, prepare shards, train the learned and canonical interfaces (3 seeds) on a small body (the tiny "
        "recipe at d = 64, 2 layers, a 1,024-token BPE), "
        "evaluate validation loss and bits per byte (and HellaSwag/PIQA/LAMBADA when their files are present), "
        "and write a report. No network needed. Re-running reuses finished work. Python API: "
        "tablefree.demo.run_demo(corpus=None, eval_data=None, out='runs/demo'). See docs/demo.md.",
    )
    parser.add_argument("--corpus", type=Path, default=None, help="any text corpus instead of the default")
    parser.add_argument(
        "--eval-data",
        type=Path,
        default=None,
        help="benchmark files (default: $TABLEFREE_EVAL_DATA, then ~/.cache/tablefree/eval)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="output directory (default: runs/demo)"
    )
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default="0,1,2",
        help="comma-separated seeds (default: 0,1,2: paired differences over three seeds; two leave one degree of "
        "freedom, too few to resolve anything honestly)",
    )
    parser.add_argument(
        "--interfaces",
        type=parse_interfaces,
        default=None,
        help="comma-separated interfaces to train (default: learned,canonical, the headline pair; e.g. "
        "learned,canonical,affine adds a third at half as much time again)",
    )
    parser.add_argument(
        "--budget",
        default=None,
        help="training tokens per run (default: 500k)",
    )
    parser.add_argument(
        "--eval-limit",
        type=limit_arg,
        default=500,
        metavar="N",
        help="first N >= 1 documents of each benchmark, or 'all' for the full sets (much longer) "
        "(default: %(default)s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tablefree.demo import run_demo

    result = run_demo(
        corpus=args.corpus,
        eval_data=args.eval_data,
        out=args.out,
        seeds=args.seeds,
        budget=args.budget,
        eval_limit=args.eval_limit,
        interfaces=args.interfaces,
    )
    print()
    print(f"report: {Path(result['out']) / 'report.md'}")
    for line in result["summary"]:
        print(f"  {line}")
    if result["failed"]:
        print(f"failed runs: {', '.join(result['failed'])} (see error.txt in each run directory)")
        return 1
    return 0
