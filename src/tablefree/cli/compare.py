"""``tablefree compare`` and ``tablefree report``: the matched interface comparison and its report
(Python API: ``tablefree.compare.run_sweep``, ``tablefree.report.build_report``)."""

from __future__ import annotations

import argparse
import shlex
import signal
from pathlib import Path

from tablefree import launch
from tablefree.config_parsing import parse_token_budgets


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
        "`dataset.corpus=CORPUS` to have compare prepare it into a new DIR. Budgets as separate runs: "
        "`grid.budget=[240k,1M,4M]` with `grid.branch=true` (wsd) decays each shorter budget from the largest's "
        "stable phase; `grid.lr=[1e-3,2e-3]` picks each interface's rate on the selection split "
        "(`train.data.select_every=50`); the report fits L(D) = E + B·D^(-β) per interface with a backtest "
        "(configs/study-cpu-scaling.yaml, configs/study-cpu-lr.yaml). See docs/experiments.md.",
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
        "--interfaces",
        type=parse_interfaces,
        default=None,
        help="comma-separated, e.g. learned,canonical,affine",
    )
    compare.add_argument("--seeds", type=parse_seeds, default=None, help="comma-separated, e.g. 0,1,2")
    compare.add_argument("--out", type=Path, default=None, help="sweep directory (default: the config's out)")
    compare.add_argument("--no-report", action="store_true", help="run the sweep without writing the report")
    cluster = compare.add_argument_group(
        "on a SLURM cluster (launch.backend=slurm: submit every run as a job array and return; docs/distributed.md)"
    )
    cluster.add_argument(
        "--status",
        action="store_true",
        help="show each run's state (run directory and scheduler); run nothing",
    )
    cluster.add_argument(
        "--emit-sbatch",
        type=Path,
        metavar="FILE",
        help="write the sweep's unfinished runs as a plain sbatch array script (one line per run); run nothing",
    )
    cluster.add_argument(
        "--only",
        metavar="RUN",
        help="run one run of the sweep here, by name (e.g. canonical-s1; a task's command)",
    )
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
    report.add_argument(
        "--predict-at",
        type=_budgets,
        default=None,
        metavar="BUDGETS",
        help="comma-separated token budgets at which the fitted curves predict each gap, e.g. 17B,100B "
        "(default: the sweep config's predict_at); each prediction says how far beyond the largest budget "
        "run it reaches and whether the backtest held",
    )
    report.set_defaults(func=run_report)


def _budgets(text: str) -> list[int]:
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(
            f"--predict-at: expected token counts such as 17B,100B, got {text!r}"
        )
    try:
        return parse_token_budgets(parts, "--predict-at")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_interfaces(text: str) -> list[str]:
    """``--interfaces learned,canonical`` (shared by `compare` and `demo`)."""
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
    if args.status:
        return print_status(config)
    if args.emit_sbatch:
        from tablefree.sweep.slurm import emit_sbatch

        emit_sbatch(config, args.emit_sbatch)
        return 0
    if args.only:
        return run_only(config, args.only)
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


def print_status(config) -> int:
    from tablefree.sweep.plan import plan_runs
    from tablefree.sweep.status import describe_holder, sweep_holder, sweep_status

    status = sweep_status(config, plan_runs(config))
    width = max(len(name) for name in status)
    print(f"{'run':<{width}}  {'state':<11}  {'job':<14}  queue")
    for name, entry in status.items():
        print(f"{name:<{width}}  {entry['state']:<11}  {entry['job'] or '-':<14}  {entry['queue'] or '-'}")
    counts = {state: [e["state"] for e in status.values()].count(state) for state in ("done", "failed")}
    summary = f"{counts['done']}/{len(status)} done, {counts['failed']} failed"
    holder = sweep_holder(config.out_dir) if config.launch.backend != "slurm" else None
    if holder is not None:
        print(f"{summary}; the sweep is running here ({describe_holder(holder)}): wait for it, or stop it")
        return 0
    again = "resubmit" if config.launch.backend == "slurm" else "run the rest here"
    stopped = [name for name, entry in status.items() if entry["state"] == "running"]
    if (
        stopped and config.launch.backend != "slurm"
    ):  # no process holds the sweep: killed before it recorded it
        summary += f"; no process runs the sweep now, so {', '.join(stopped)} stopped without recording it"
    print(f"{summary} (re-run the command without --status to {again})")
    return 0


def run_only(config, name: str) -> int:
    """One run, as a task of the sbatch script runs it; exit REQUEUE_EXIT_CODE when preempted after saving."""
    from tablefree.sweep.plan import plan_runs
    from tablefree.sweep.slurm import run_job

    plans = {run.name: run for run in plan_runs(config)}
    if name not in plans:
        raise SystemExit(f"--only {name}: no such run in {config.name}; expected one of {', '.join(plans)}")

    def preempted(signum, frame):  # outside training (the trainer has its own handler): stop, requeue
        raise launch.Preempted(f"{name}: preempted")

    signal.signal(launch.PREEMPT_SIGNAL, preempted)
    try:
        state = run_job(config, plans[name])
    except launch.Preempted as stopped:
        print(f"{stopped}: exiting for requeue")
        return launch.REQUEUE_EXIT_CODE
    return 0 if state in ("done", "trained") else 1


def compare_command(args: argparse.Namespace) -> str:
    """The `tablefree compare` command line that ran (and resumes) this sweep."""
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
    from tablefree.report.scaling_markdown import predict_at_answer

    report = build_report(args.sweep_dir, n_boot=args.bootstrap, predict_at=args.predict_at)
    print_verdict(report, args.sweep_dir)
    for line in predict_at_answer(report, args.predict_at):
        print(f"  {line}")
    return 0


def print_verdict(report: dict, out: Path) -> None:
    from tablefree.report import verdict
    from tablefree.report.comparison import few_seeds_sentence

    print(f"report: {out / 'report.md'}")
    caveat = report["statistics"].get("few_seeds")
    if caveat:
        print(f"  {few_seeds_sentence(caveat, markdown=False)}")
    for c in verdict(report):
        point = f"[{c['point']}] " if c["point"] else ""
        print(f"  {point}{c['metric']}, {c['a']} vs {c['b']}: {c['sentence']}")
    baseline = report.get("baseline")
    if baseline and baseline["not_beaten_by"]:
        from tablefree.report.comparison import UNIGRAM_FLAG

        print(f"  {UNIGRAM_FLAG}: {', '.join(baseline['not_beaten_by'])}")
