"""``tablefree params``: parameter breakdown of a preset and interface (Python API: ``tablefree.param_breakdown``)."""

from __future__ import annotations

import argparse
import json

from tablefree.config import PRESETS, preset
from tablefree.interfaces import INTERFACES
from tablefree.params import format_breakdown, param_breakdown


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "params",
        help="parameter breakdown of a preset (built on the meta device)",
        description="Count trainable parameters by component, and the difference from the learned table. "
        "Python API: tablefree.param_breakdown(tablefree.preset(NAME, interface=...)).",
    )
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--interface", default="canonical", choices=sorted(INTERFACES))
    parser.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary size")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    breakdown = param_breakdown(preset(args.preset, interface=args.interface, **overrides))
    if args.json:
        print(json.dumps({"preset": args.preset, **breakdown.as_dict()}, indent=2))
    else:
        print(f"preset: {args.preset}")
        print(format_breakdown(breakdown))
    return 0
