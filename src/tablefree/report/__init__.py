"""The comparison report of a sweep directory: ``report.md``, ``report.json``, ``report_data.json`` (the raw
per-document and per-curve numbers, ``report.data``) and PNG figures.

``build_report`` reads only the files of the sweep directory (layout: ``tablefree.rundir``), so a report can be
rebuilt at any time (``tablefree report SWEEP_DIR``), also from a partly finished sweep. The parts:
``comparison`` (what is compared with what, via ``tablefree.stats``), ``markdown`` and ``figures``.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from tablefree import __version__, stats
from tablefree.analysis.frequency_bands import sweep_frequency_bands
from tablefree.analysis.sweep import sweep_analysis
from tablefree.config_parsing import load_yaml
from tablefree.evaluate.evaluator import git_commit as source_commit
from tablefree.fileio import strict_json, write_json_atomic, write_text_atomic
from tablefree.report import comparison, curves, regime, tuning
from tablefree.report.data import DATA_FILE, report_data, run_row
from tablefree.report.figures import draw_figures
from tablefree.report.markdown import render_markdown
from tablefree.report.scaling_figures import draw_scaling_figures
from tablefree.rundir import RUN_FILES, Run, find_runs, sweep_config

__all__ = ["build_report", "verdict"]


def build_report(
    sweep_dir: str | Path, n_boot: int | None = None, predict_at: list[str | int] | None = None
) -> dict[str, Any]:
    """Write ``report.md``, ``report.json``, ``report_data.json`` and ``figures/*.png`` into ``sweep_dir``;
    return the JSON report. ``predict_at`` (token budgets, e.g. ["17B", "100B"]) replaces the sweep config's
    budgets at which the fitted curves predict the gaps."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory not found: {sweep_dir}")
    runs = find_runs(sweep_dir)
    if not runs:
        raise FileNotFoundError(f"{sweep_dir}: no runs (expected runs/{{interface}}-s{{seed}}/ directories)")
    config = sweep_config(sweep_dir)
    n_boot = n_boot or int(config.get("bootstrap", stats.DEFAULT_BOOTSTRAP))
    report = assemble(sweep_dir, runs, config, n_boot, predict_at)
    figures_dir = sweep_dir / "figures"
    figures_dir.mkdir(exist_ok=True)
    report["figures"] = draw_figures(runs, report, figures_dir)
    for entry in report["statistics"]["fitted_curves"]:
        report["figures"] += draw_scaling_figures(entry["fits"], curves.observations_of(entry), figures_dir)
    write_json_atomic(sweep_dir / "report.json", strict_json(report))
    data = report_data(runs, config)
    # the rate checks' choices, which the data alone cannot make (the selection losses stay in the run directories)
    data["own_rate_points"] = [check["own_points"] for check in report["statistics"]["learning_rate"]]
    data["frequency_bands"] = report["frequency_bands"]
    write_json_atomic(sweep_dir / DATA_FILE, strict_json(data))
    write_text_atomic(sweep_dir / "report.md", render_markdown(report))
    return report


def assemble(
    sweep_dir: Path,
    runs: list[Run],
    config: dict[str, Any],
    n_boot: int,
    predict_at: list[str | int] | None = None,
) -> dict[str, Any]:
    """The report's content (everything but the figures)."""
    interfaces = comparison.ordered_interfaces(runs)
    points = comparison.ordered_points(runs, config)
    # the control interfaces every other one is compared with (compare's `baselines`), those that have runs
    controls = [name for name in config.get("baselines") or [] if name in interfaces]
    per_point, comps, gaps, complete = [], [], [], []
    for point in points:
        here = [run for run in runs if run.point == point]
        if set(interfaces) <= {run.interface for run in comparison.finished(here)}:
            complete.append(point)
        table = comparison.metric_table(comparison.finished(here), interfaces)
        per_point.append(
            {
                "name": point,
                "metrics": table,
                "params": _params(here, interfaces),
                "cv_val_ppl": comparison.seed_cv(table),
                "validation_set": comparison.validation_set(here),
            }
        )
        comps += comparison.comparisons(here, interfaces, n_boot, point, controls)
        gaps += comparison.gap_curves(here, interfaces, point, controls)
    # the last grid point (the largest budget or model) at which every interface finished a run, or the only
    # one: a point that trains some interfaces only (a per-interface rate grid) would leave the others out
    primary = next((p for p in reversed(per_point) if p["name"] in complete), per_point[-1])
    baseline = comparison.unigram_baseline(runs)
    rate_checks = tuning.learning_rate_checks(runs, config, interfaces, n_boot, controls)
    return {
        "name": config.get("name", sweep_dir.name),
        "sweep_dir": str(sweep_dir),  # as given: a committed report names no local absolute path
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interfaces": interfaces,
        "controls": controls,
        "seeds": sorted({run.seed for run in runs}),
        "points": per_point,
        "primary_point": primary["name"],
        "metrics": primary["metrics"],
        "params": primary["params"],
        "validation_set": primary["validation_set"],
        "runs": [run_row(run) for run in runs],
        "accounting": comparison.run_accounting(runs),
        "headlines": comparison.headlines(runs),
        "baseline": baseline,
        "regime": regime.regime(runs, points),
        "statistics": {
            "method": stats.__doc__,
            "bootstrap_replicates": n_boot,
            "comparisons": comps,
            "few_seeds": comparison.few_seeds(comps),
            "gap": gaps,
            "grid": comparison.grid_summary(runs, points, interfaces, comps) if len(points) > 1 else [],
            "learning_rate": rate_checks,
            "fitted_curves": curves.fitted_curves(
                runs, config, interfaces, controls, n_boot, predict_at, baseline
            ),
        },
        "config": config,
        "train_config": _train_config(runs),
        "git": git_commit(),
        "environment": environment(),
        "analysis": _sweep_analysis(runs, sweep_dir),
        "frequency_bands": _frequency_bands(
            runs, points, interfaces, controls, n_boot, [check["own_points"] for check in rate_checks]
        ),
    }


def _sweep_analysis(runs: list[Run], sweep_dir: Path) -> dict[str, Any] | None:
    """The runs' ``tablefree analyze`` results side by side (compare's ``analysis: true``), or None."""
    return sweep_analysis(runs, sweep_dir)


def _frequency_bands(
    runs: list[Run],
    points: list[str],
    interfaces: list[str],
    controls: list[str],
    n_boot: int,
    own_points: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """Per grid point, each compared pair's validation gap split by frequency band of the input and of the
    target token (``tablefree.analysis.frequency_bands``); then the same at each rate check's own best rates
    (``own_points``), where the interfaces chose different rates."""
    pairs = comparison.interface_pairs(interfaces, controls)
    return sweep_frequency_bands(comparison.finished(runs), points, pairs, n_boot, own_points)


def verdict(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparisons that answer a question (one per pair: validation loss and each benchmark's headline)."""
    return report["statistics"]["comparisons"]


def _params(runs: list[Run], interfaces: list[str]) -> dict[str, dict[str, Any]]:
    params = {}
    for interface in interfaces:
        for run in runs:
            if run.interface == interface and run.summary and run.summary.get("params"):
                params[interface] = run.summary["params"]
                break
    return params


def _train_config(runs: list[Run]) -> dict[str, Any] | None:
    for run in runs:
        path = run.directory / RUN_FILES["config"]
        if path.exists():
            return load_yaml(path)
    return None


# ------------------------------------------------------------------------------------------------------------
# Provenance


def git_commit() -> dict[str, Any]:
    """The commit of the tablefree checkout (and whether it has uncommitted changes), when it is one."""
    commit = source_commit()
    if commit is None:
        return {"commit": None, "dirty": None, "version": __version__}
    try:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": commit, "dirty": None}
    return {"commit": commit, "dirty": bool(status)}


def environment() -> dict[str, Any]:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
    return env
