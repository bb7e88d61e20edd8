"""``report_data.json``, the raw numbers beside ``report.json``: per run its per-document validation losses and
token counts and its in-training curve (the points of ``metrics.jsonl``), so that every interval, p-value and
slope of the report can be recomputed without the run directories (``statistics_from_data``), and a scaling fit
can read each run's final loss, tokens and parameters. Format: docs/experiments.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablefree.analysis.frequency_bands import sweep_frequency_bands
from tablefree.compat import ESTIMATE_KEYS
from tablefree.fileio import read_json
from tablefree.report import comparison
from tablefree.rundir import Run
from tablefree.sweep.branch_record import read_branch

DATA_FILE = "report_data.json"
FORMAT = "tablefree-report-data/1"
CURVE_KEYS = ("step", "tokens", "train_loss", "lr", *ESTIMATE_KEYS)


def report_data(runs: list[Run], config: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's content: the sweep's compared pairs' settings and one record per run."""
    return {
        "format": FORMAT,
        "baselines": config.get("baselines") or [],
        "grid_points": [p["name"] for p in config.get("grid_points") or []],
        "runs": [run_record(run) for run in runs],
    }


def run_row(run: Run) -> dict[str, Any]:
    """A run as ``report.json`` lists it: its state, training and evaluation outcome."""
    summary, status = run.summary or {}, run.status
    row = _identity(run)
    if row["state"] == "done" and comparison.not_finished_because(run):  # as --status reads the run directory
        row["state"] = "todo" if not summary or summary.get("completed") is False else "trained"
    return {
        **row,
        "error": status.get("error"),
        "tokens_seen": summary.get("tokens_seen"),
        "train_wall_s": summary.get("wall_time_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "eval_wall_s": status.get("eval_wall_s"),
        "final_train_loss": summary.get("final_train_loss"),
        "final_val_estimate": run.final_estimate(),
        "completed": summary.get("completed"),
        "metrics": run.metric_values(),
        # a budget branch resumes its trunk's checkpoint: its wall time and tokens/s include the trunk's up to it
        "branched_at_step": (read_branch(run.directory) or {}).get("step"),
    }


def run_record(run: Run) -> dict[str, Any]:
    """A run as ``report_data.json`` keeps it: the raw numbers its statistics recompute from."""
    validation = ((run.eval or {}).get("tasks") or {}).get(comparison.VALIDATION) or {}
    summary = run.summary or {}
    return {
        **_identity(run),
        "tokens_seen": summary.get("tokens_seen"),
        "params": summary.get("params"),
        "validation": {
            key: validation.get(key)
            for key in ("metrics", "tokens", "bytes", "n", "per_document", "frequency_bands")
        },
        "curve": [
            {key: record[key] for key in CURVE_KEYS if key in record} for record in run.metrics_records()
        ],
    }


def _identity(run: Run) -> dict[str, Any]:
    """What names a run, the same in both files."""
    return {
        "name": run.name,
        "point": run.point,
        "interface": run.interface,
        "seed": run.seed,
        "state": run.state,
    }


@dataclass
class DataRun(Run):
    """A run rebuilt from ``report_data.json``: what ``comparison`` reads, with the curve held in memory."""

    curve: list[dict[str, Any]] = field(default_factory=list)

    def metrics_records(self) -> list[dict[str, Any]]:
        return self.curve


def runs_from_data(data: dict[str, Any]) -> list[DataRun]:
    if data.get("format") != FORMAT:
        raise ValueError(f"report data: expected format {FORMAT!r}, got {data.get('format')!r}")
    runs = []
    for record in data["runs"]:
        validation = {k: v for k, v in record["validation"].items() if v is not None}
        runs.append(
            DataRun(
                interface=record["interface"],
                seed=int(record["seed"]),
                directory=Path(record["name"]),
                point=record["point"],
                status={"state": record["state"]},
                summary={"tokens_seen": record["tokens_seen"], "params": record["params"]},
                eval={"tasks": {comparison.VALIDATION: validation}} if validation else None,
                curve=record["curve"],
            )
        )
    return runs


def statistics_from_data(path: str | Path, n_boot: int) -> dict[str, list[dict[str, Any]]]:
    """The validation comparisons, the gap curves and the frequency-band split of a report (at each grid point
    and at the rate checks' own best rates, which the file keeps as ``own_rate_points``), recomputed from
    ``report_data.json`` alone (benchmark comparisons need the per-example files and are not in it)."""
    data = read_json(path)
    runs = runs_from_data(data)
    interfaces = comparison.ordered_interfaces(runs)
    points = comparison.ordered_points(runs, {"grid_points": [{"name": p} for p in data["grid_points"]]})
    controls = [name for name in data["baselines"] if name in interfaces]
    comps, gaps = [], []
    for point in points:
        here = [run for run in runs if run.point == point]
        comps += comparison.comparisons(here, interfaces, n_boot, point, controls)
        gaps += comparison.gap_curves(here, interfaces, point, controls)
    pairs = comparison.interface_pairs(interfaces, controls)
    own_points = data.get("own_rate_points") or []  # absent from data written before it was kept
    bands = sweep_frequency_bands(comparison.finished(runs), points, pairs, n_boot, own_points)
    return {"comparisons": comps, "gap": gaps, "frequency_bands": bands}
