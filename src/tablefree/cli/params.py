"""``tablefree params``: parameter breakdown of a preset and interface (Python API: ``tablefree.param_breakdown``)."""

from __future__ import annotations

import argparse
import json

from tablefree.config_parsing import apply_overrides
from tablefree.interfaces import INTERFACES
from tablefree.model_config import PRESETS, preset
from tablefree.params import format_breakdown, format_comparison, param_breakdown


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "params",
        help="parameter breakdown of a preset (built on the meta device)",
        description="Count trainable parameters by component, and the difference from the learned table. "
        "Python API: tablefree.param_breakdown(tablefree.preset(NAME, interface={'name': ..., **options})).",
    )
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument(
        "--interface",
        default="canonical",
        choices=[*sorted(INTERFACES), "all"],
        help="input interface (default: canonical); all: one breakdown per registered interface",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an interface option, e.g. --option width=64 (repeatable; ignored by interfaces without it)",
    )
    parser.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary size")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    options = apply_overrides({}, args.option)
    names = sorted(INTERFACES) if args.interface == "all" else [args.interface]
    breakdowns = [
        param_breakdown(preset(args.preset, interface={**options, "name": name}, **overrides))
        for name in names
    ]
    if args.json:
        rows = [{"preset": args.preset, **b.as_dict()} for b in breakdowns]
        print(json.dumps(rows if args.interface == "all" else rows[0], indent=2))
    else:
        print(f"preset: {args.preset}")
        print(format_breakdown(breakdowns[0]) if len(breakdowns) == 1 else format_comparison(breakdowns))
    return 0
