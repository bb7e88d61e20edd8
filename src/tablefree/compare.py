"""The matched interface comparison: one training recipe, every (interface, seed) pair, evaluated and reported.

``run_sweep(config)`` plans every run (``tablefree.sweep.plan``), checks the whole sweep before anything trains,
runs the plan here (``tablefree.sweep.local``) or on a SLURM cluster (``tablefree.sweep.slurm``), and writes the
report with ``tablefree.report.build_report``. Per run only the interface and the seed change; the trainer makes
the backbone initialisation and data order identical across interfaces for a seed. Layout of the sweep
directory::

    OUT/compare.yaml                 # the resolved sweep config (recipe, interfaces, seeds, eval, launch)
    OUT/runs/{interface}-s{seed}/    # a training run dir, plus eval.json, eval_examples.jsonl, status.json
    OUT/runs/{point}/{interface}-s{seed}/   # the same per grid point, when the config has a grid
    OUT/report.md, report.json, figures/*.png

The layout's names live in ``tablefree.rundir``.

Resumable: a run with a completed summary and evaluation results for every requested task is skipped; a
trained but unevaluated run is only evaluated; any other run resumes from its newest checkpoint (or starts).
A run that fails has its traceback written to ``error.txt`` and the sweep goes on with the others.

``launch.backend: slurm`` submits the runs instead, as one SLURM job array, and returns;
``tablefree.sweep.status.sweep_status`` reads each run's state back.
"""

from __future__ import annotations

from typing import Any

from tablefree.analysis.sweep import analyze_runs
from tablefree.report import build_report
from tablefree.sweep.config import CompareConfig, load_compare_config
from tablefree.sweep.dataset import prepare_data
from tablefree.sweep.local import run_local
from tablefree.sweep.plan import check_plans, check_sweep, plan_runs
from tablefree.sweep.record import write_sweep_config
from tablefree.sweep.slurm import submit_sweep
from tablefree.sweep.status import check_branches

__all__ = ["CompareConfig", "load_compare_config", "run_sweep"]


def run_sweep(config: CompareConfig, report: bool = True, log=print) -> dict[str, Any]:
    """Train, evaluate and report every (interface, seed) run of ``config``; returns the sweep outcome
    (``{"out": dir, "runs": {name: state}, "failed": [names], "report": report dict or None}``)."""
    out = config.out_dir
    plans = plan_runs(config)
    check_plans(config, plans)  # before a long data preparation
    prepare_data(config, log)
    check_sweep(config, plans)
    check_branches(plans)  # a deleted or edited branch.json: refused before anything trains
    out.mkdir(parents=True, exist_ok=True)
    write_sweep_config(config, out)
    if config.launch.backend == "slurm":
        return submit_sweep(config, plans, log)
    result = run_local(config, plans, log)
    if config.analysis:  # each finished run against the learned run of its seed (docs/analysis.md)
        done = {name for name, state in result["runs"].items() if state == "done"}
        result["analysis"] = analyze_runs(plans, done, device=config.eval.device, log=log)
    if report:
        log(f"writing the report in {out}")
        result["report"] = build_report(out, n_boot=config.bootstrap)
    return result
