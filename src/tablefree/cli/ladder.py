"""``tablefree ladder``: one question asked of several model sizes, each its own budget sweep (Python API:
``tablefree.report.ladder.ladder_data`` and ``write_ladder``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tablefree import stats
from tablefree.fileio import read_json


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ladder",
        help="compare the interfaces' gap across model sizes (rungs), each a budget sweep of its own",
        description="Read each rung's report directory (report.json and report_data.json, as `tablefree report` "
        "writes them), take the budgets at the given tokens per parameter of each rung's learned model, and write "
        "OUT/report.md, report.json, report_data.json (the ladder's raw data) and figures/ladder.png: per rung the "
        "gaps with intervals, the token ratio, the table share and compute 6·N·D; across rungs each gap's change "
        "and, with three rungs or more, its slope against depth and compute. `--data OUT/report_data.json` "
        "rebuilds the ladder from its raw data alone. Python API: "
        "tablefree.report.ladder.write_ladder(OUT, ladder_data(RUNG_DIRS)).",
    )
    parser.add_argument("rungs", nargs="*", type=Path, metavar="RUNG_DIR", help="a rung's report directory")
    parser.add_argument("--out", type=Path, required=True, help="the ladder's directory")
    parser.add_argument("--data", type=Path, default=None, help="rebuild from this report_data.json instead")
    parser.add_argument(
        "--ratios",
        default="7.5,15,30",
        help="tokens per learned parameter, comma-separated (default: 7.5,15,30)",
    )
    parser.add_argument(
        "--rate",
        type=_rate,
        default=None,
        help="the peak rate to compare every rung at, where a rung's grid also has rates (default: its only one), "
        "or `own`: each interface at the rate its rung's rate check chose at the rung's largest budget",
    )
    parser.add_argument(
        "--rate-check",
        action="append",
        type=Path,
        default=[],
        metavar="CHECK_DIR",
        help="with --rate own: the report directory of a rate check swept apart from its rung (the rung's body at "
        "its largest budget), used for the rung of the same body; repeatable",
    )
    parser.add_argument(
        "--interfaces",
        default=None,
        help="compare only these interfaces, comma-separated, learned among them (default: every one trained)",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=stats.DEFAULT_BOOTSTRAP, help="bootstrap replicates (default: 10000)"
    )
    parser.set_defaults(func=run)


def _rate(text: str) -> float | str:
    if text == "own":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or `own`, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from tablefree.report.ladder import ladder_data, write_ladder

    if bool(args.rungs) == bool(args.data):
        raise ValueError(
            "give either RUNG_DIR... (two or more report directories) or --data REPORT_DATA_JSON"
        )
    try:
        ratios = [float(part) for part in args.ratios.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--ratios: expected numbers separated by commas, got {args.ratios!r}") from None
    interfaces = [i.strip() for i in args.interfaces.split(",") if i.strip()] if args.interfaces else None
    if args.data:
        data = read_json(args.data)
    else:
        data = ladder_data(args.rungs, ratios, args.rate, rate_checks=args.rate_check, interfaces=interfaces)
    report = write_ladder(args.out, data, n_boot=args.bootstrap)
    print(f"ladder: {args.out / 'report.md'}")
    for sentence in report["sentences"]:
        print(f"  {sentence}")
    return 0
