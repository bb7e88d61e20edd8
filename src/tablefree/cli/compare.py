"""``tablefree compare`` and ``tablefree report``: the matched interface comparison and its report
(Python API: ``tablefree.compare.run_sweep``, ``tablefree.report.build_report``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    compare = subparsers.add_parser(
        "compare",
        help="train, evaluate and compare the input interfaces over seeds under one recipe",
        description="Train every (interface, seed) run of one recipe (and of every grid point: several budgets "
        "and/or model sizes), evaluate each, and write report.md, report.json and figures: differences paired by "
        "seed with intervals that include the evaluation set's sampling, Holm-corrected across pairs. The whole "
        "sweep is checked before anything trains. Re-running the same command resumes: finished runs are "
        "skipped, an interrupted run continues from its checkpoint. Python API: tablefree.compare.run_sweep("
        "tablefree.compare.load_compare_config(PATH, interfaces, seeds, out, overrides)). On your own data: "
        "`dataset.dir=DIR` names a prepared dataset (`tablefree data prepare CORPUS --out DIR`); add "
        "`dataset.corpus=CORPUS` to have compare prepare it into a new DIR. See docs/experiments.md.",
    )
    compare.add_argument(
        "--config", type=Path, required=True, help="a compare YAML, e.g. configs/compare-tiny.yaml"
    )
    compare.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides, e.g. dataset.dir=data/mine eval.limit=null train.budget=1M eval.data_dir=DIR",
    )
    compare.add_argument(
        "--interfaces", type=_names, default=None, help="comma-separated, e.g. learned,canonical,affine"
    )
    compare.add_argument("--seeds", type=parse_seeds, default=None, help="comma-separated, e.g. 0,1,2")
    compare.add_argument("--out", type=Path, default=None, help="sweep directory (default: the config's out)")
    compare.add_argument("--no-report", action="store_true", help="run the sweep without writing the report")
    compare.set_defaults(func=run_compare)

    report = subparsers.add_parser(
        "report",
        help="(re)build the report of a sweep directory",
        description="Rebuild report.md, report.json and figures/ from a sweep directory's run files (also of a "
        "partly finished sweep). Python API: tablefree.report.build_report(SWEEP_DIR).",
    )
    report.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR")
    report.add_argument(
        "--bootstrap", type=int, default=None, help="bootstrap replicates (default: the sweep's)"
    )
    report.set_defaults(func=run_report)


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated interface names")
    return names


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` (shared by `compare` and `demo`)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def run_compare(args: argparse.Namespace) -> int:
    from tablefree.compare import load_compare_config, run_sweep

    config = load_compare_config(args.config, args.interfaces, args.seeds, args.out, args.overrides)
    try:
        result = run_sweep(config, report=not args.no_report)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: finished runs are kept in {config.out_dir}; resume the sweep (the interrupted run "
            f"continues from its last checkpoint) with\n  {compare_command(args)}"
        )
        return 130
    if result["report"] is not None:
        print_verdict(result["report"], Path(result["out"]))
    if result["failed"]:
        print(f"failed runs: {', '.join(result['failed'])} (see error.txt in each run directory)")
        return 1
    return 0


def compare_command(args: argparse.Namespace) -> str:
    """The `tablefree compare` command line that ran (and resumes) this sweep."""
    import shlex

    argv = ["tablefree", "compare", "--config", str(args.config)]
    if args.interfaces:
        argv += ["--interfaces", ",".join(args.interfaces)]
    if args.seeds:
        argv += ["--seeds", ",".join(map(str, args.seeds))]
    if args.out:
        argv += ["--out", str(args.out)]
    if args.no_report:
        argv.append("--no-report")
    return shlex.join([*argv, *args.overrides])


def run_report(args: argparse.Namespace) -> int:
    from tablefree.report import build_report

    report = build_report(args.sweep_dir, n_boot=args.bootstrap)
    print_verdict(report, args.sweep_dir)
    return 0


def print_verdict(report: dict, out: Path) -> None:
    from tablefree.report import verdict

    print(f"report: {out / 'report.md'}")
    for c in verdict(report):
        point = f"[{c['point']}] " if c["point"] else ""
        print(f"  {point}{c['metric']}, {c['a']} vs {c['b']}: {c['sentence']}")
    baseline = report.get("baseline")
    if baseline and baseline["not_beaten_by"]:
        from tablefree.report.comparison import UNIGRAM_FLAG

        print(f"  {UNIGRAM_FLAG}: {', '.join(baseline['not_beaten_by'])}")
