"""The ``tablefree`` command line. Each verb lives in a module of ``tablefree.commands`` that exposes
``add_commands(subparsers)``; every verb has a Python API counterpart, named in its ``--help``."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute verbs, in the order their verbs appear in ``tablefree --help``.
COMMAND_MODULES = [
    "tablefree.commands.demo",
    "tablefree.commands.compare",
    "tablefree.commands.train",
    "tablefree.commands.eval",
    "tablefree.commands.data",
    "tablefree.commands.interop",
    "tablefree.commands.params",
    "tablefree.commands.hardware",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tablefree",
        description="Train and study language models with no trainable input embedding table.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:  # a verb module not written yet
                continue
            raise
        module.add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"tablefree {args.verb}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tablefree {args.verb}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
