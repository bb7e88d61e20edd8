"""The ``tablefree`` command line. Each verb lives in a module of ``tablefree.cli`` that exposes
``add_commands(subparsers)``; every verb has a Python API counterpart, named in its ``--help``.

Conventions shared by every verb (README "Command-line conventions"): ``KEY=VALUE`` overrides may stand
anywhere on the command line of a verb that takes them; lists are comma-separated (``--tasks a,b``,
``--seeds 0,1``); errors are one line, ``tablefree VERB: error: ...``, with exit status 1 (2 for usage); a full
disk too ("no space left on MOUNT while writing FILE").

Why a command imports only its verb's module, and some verbs import inside their function: a command that names
its verb builds the parser from the one module that adds it (``COMMAND_MODULES``), so a ``data prepare --part``
job never loads torch through ``eval``; ``tablefree --help`` (and an unknown verb) imports every verb module to
list them all. So an import at a verb module's top is paid by every verb of that module and by ``--help``. An
import stays inside a verb's function only where it would add measurably to those: the trainer and what loads it
(torch.distributed, through ``tablefree.train.resume``, ``tablefree.compare`` and ``tablefree.demo``), the memory
planner, the sweep's SLURM executor (submitit), plan and status, the report and the ladder, the evaluation
downloader (pyarrow) and the lm-eval adapter (an optional dependency). docs/benchmarks.md, "Command-line
start-up", has the measurements. Every other import is at its module's top; the library modules below keep their
own few lazy imports (matplotlib, pyarrow, torch.distributed.checkpoint, optional packages) for the same reason,
each with a comment. ``data prepare`` (a part too) and ``data verify`` load no torch (tested).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version

from tablefree.cpu_threads import choose_wait_policy

# Modules that contribute verbs, with the verbs each adds, in the order they appear in ``tablefree --help``
# (tests/test_cli.py checks each module adds exactly these).
COMMAND_MODULES = {
    "tablefree.cli.demo": ("demo",),
    "tablefree.cli.compare": ("compare", "report"),
    "tablefree.cli.ladder": ("ladder",),
    "tablefree.cli.train": ("train",),
    "tablefree.cli.eval": ("eval",),
    "tablefree.cli.analyze": ("analyze",),
    "tablefree.cli.data": ("tokenizer", "data"),
    "tablefree.cli.interop": ("export", "import-hf", "generate", "lm-eval", "lm-eval-tasks"),
    "tablefree.cli.params": ("params",),
    "tablefree.cli.memory": ("memory",),
    "tablefree.cli.hardware": ("hardware",),
}


def version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    try:
        return distribution_version("tablefree")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv``'s verb alone when its first argument names one (its module is the only one imported);
    otherwise (``--help``, no verb, an unknown one) the parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="tablefree",
        description="Train and study language models with no trainable input embedding table.",
    )
    parser.add_argument("--version", action="version", version=f"tablefree {version()}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    verb = argv[0] if argv else None
    named = [module for module, verbs in COMMAND_MODULES.items() if verb in verbs]
    for module_name in named or COMMAND_MODULES:
        importlib.import_module(module_name).add_commands(subparsers)
    return parser


def is_override(argument: str) -> bool:
    """``KEY=VALUE`` with a dotted key, as opposed to an option (``--x``) or a path."""
    key, sep, _ = argument.partition("=")
    return bool(sep) and bool(key) and not argument.startswith("-")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, accepting ``KEY=VALUE`` overrides anywhere for the verbs that take them.

    argparse gives a ``nargs="*"`` positional only its first run of arguments, so overrides typed after an
    option (``train --config C a=1 --run-dir R b=2``) come back unrecognized; they join the verb's overrides
    in the order they were typed.
    """
    _refuse_spaced_lists(parser, sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        if isinstance(getattr(args, "overrides", None), list) and all(map(is_override, extras)):
            args.overrides = [*args.overrides, *extras]
        else:
            verb_parser = _verb_parser(parser, getattr(args, "verb", None)) or parser
            verb_parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _refuse_spaced_lists(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``--seeds 0, 1, 2``: a list option's value split by spaces would leave ``1,`` and ``2`` to be read as
    overrides or paths; name the option and the spaces instead."""
    for i, token in enumerate(argv[:-1]):
        if not (token.startswith("--") and "=" not in token):
            continue
        parts = [argv[i + 1]]
        while (
            parts[-1].endswith(",")
            and i + 1 + len(parts) < len(argv)
            and not argv[i + 1 + len(parts)].startswith("-")
        ):
            parts.append(argv[i + 1 + len(parts)])
        if len(parts) > 1 or (i + 2 < len(argv) and argv[i + 2].startswith(",")):
            verb = next((t for t in argv if not t.startswith("-")), None)
            typed = " ".join(parts if len(parts) > 1 else argv[i + 1 : i + 3])
            joined = typed.replace(" ", "")
            (_verb_parser(parser, verb) or parser).error(
                f"{token} {typed}: a comma-separated list takes no spaces; write {token} {joined}"
            )


def _verb_parser(parser: argparse.ArgumentParser, verb: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            return action.choices[verb]
    return None


def main(argv: list[str] | None = None) -> int:
    # before any verb imports torch: OpenMP reads its wait policy once, when torch loads it (tablefree.cpu_threads)
    choose_wait_policy()
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parse_args(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        sys.stdout.flush()  # what was printed so far comes before the error, not after it
        print(f"tablefree {args.verb}: error: {error}", file=sys.stderr)
        return 1
    except (
        BrokenPipeError
    ):  # `generate ... | head -1`: the reader has all it wanted (an OSError: before that clause)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a program the pipe's signal ended
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        sys.stdout.flush()
        where = (
            f" while writing {error.filename}" if error.filename and "while writing" not in str(error) else ""
        )
        print(f"tablefree {args.verb}: error: {error.strerror if where else error}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tablefree {args.verb}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
