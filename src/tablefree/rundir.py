"""The names of a run directory's and a sweep directory's files (a run's ``checkpoints/`` are
``tablefree.checkpoint``'s), finding a sweep's runs, and the one JSONL reader.

A run directory (written by ``tablefree.train.trainer.train``, plus the sweep's own files)::

    RUN/config.yaml  config_changes.json  metrics.jsonl  summary.json  checkpoints/   # the trainer's
    RUN/eval.json  eval_examples.jsonl  status.json  [error.txt]     # the sweep's (tablefree.compare)
    RUN/[selection.json]  [branch.json]    # the selection-split loss; where a budget branch started

A sweep directory (``tablefree.compare.run_sweep``)::

    SWEEP/compare.yaml                          # the resolved sweep config
    SWEEP/runs/{interface}-s{seed}/             # one run per (interface, seed)
    SWEEP/runs/{point}/{interface}-s{seed}/     # ... per grid point, when the sweep has a grid

The writers (trainer, compare) and the readers (report) both use these names, and JSONL files are read by
``read_jsonl`` alone, with one rule: a malformed *last* line is a record torn by an interrupted process and is
dropped; a malformed line anywhere else is an error naming the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablefree import fileio
from tablefree.compat import FINAL_ESTIMATE_KEYS
from tablefree.config_parsing import load_yaml
from tablefree.fileio import DuplicateKeyError

SWEEP_CONFIG = "compare.yaml"
RUNS_DIR = "runs"
RUN_FILES = {
    "config": "config.yaml",
    "summary": "summary.json",
    "metrics": "metrics.jsonl",
    "eval": "eval.json",
    "examples": "eval_examples.jsonl",
    "status": "status.json",
    "error": "error.txt",
    "selection": "selection.json",  # data.select_every: the loss on the held-out training windows
    "branch": "branch.json",  # a budget branch: the trunk run and step it started from
}
# The trainer's in-training validation *estimate* (a few batches, every val_every steps) in metrics.jsonl and
# summary.json is read under ESTIMATE_KEYS / FINAL_ESTIMATE_KEYS (tablefree.compat: newest name first). The
# evaluation over the whole validation split is eval.json's tasks.validation, a different number: the report
# never mixes the two.


@dataclass
class Run:
    """One (grid point, interface, seed) run of a sweep, as found on disk."""

    interface: str
    seed: int
    directory: Path
    point: str = ""  # the grid point's name; "" for a sweep without a grid
    status: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return run_name(self.interface, self.seed, self.point)

    @property
    def state(self) -> str:
        return self.status.get("state", "done" if self.summary and self.eval else "incomplete")

    def metric_values(self) -> dict[str, float]:
        """Final per-run metrics of the evaluation, named ``task/metric`` (``validation/val_loss`` ...)."""
        values: dict[str, float] = {}
        for task, result in ((self.eval or {}).get("tasks") or {}).items():
            for metric, value in (result.get("metrics") or {}).items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    values[f"{task}/{metric}"] = float(value)
        return values

    def metrics_records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.directory / RUN_FILES["metrics"])

    def final_estimate(self) -> float | None:
        """The trainer's last in-training validation estimate (not the evaluation over the split)."""
        return first_number(self.summary or {}, FINAL_ESTIMATE_KEYS)


def first_number(record: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def run_name(interface: str, seed: int, point: str = "") -> str:
    return f"{point}/{interface}-s{seed}" if point else f"{interface}-s{seed}"


def run_directory(sweep_dir: str | Path, interface: str, seed: int, point: str = "") -> Path:
    return Path(sweep_dir) / RUNS_DIR / run_name(interface, seed, point)


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSONL file ([] when it does not exist). A malformed last line is a record torn by an
    interrupted run and is dropped; a malformed line anywhere else is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    numbered = [
        (number, line)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if line.strip()
    ]
    rows = []
    for index, (number, line) in enumerate(numbered):
        try:
            rows.append(json.loads(line, object_pairs_hook=fileio.no_duplicate_keys))
        except DuplicateKeyError as error:
            raise ValueError(f"{path}:{number}: {error}") from None
        except json.JSONDecodeError:
            if index == len(numbered) - 1:
                continue
            raise ValueError(f"{path}:{number}: malformed JSON line") from None
    return rows


def sweep_config(sweep_dir: str | Path) -> dict[str, Any]:
    path = Path(sweep_dir) / SWEEP_CONFIG
    return load_yaml(path) if path.exists() else {}


def find_runs(sweep_dir: str | Path) -> list[Run]:
    """The sweep's runs: those its config lists (in order: grid point, interface, seed), then any other
    ``runs/[POINT/]INTERFACE-sSEED`` directories."""
    sweep_dir = Path(sweep_dir)
    config = sweep_config(sweep_dir)
    # a point may train only some interfaces (a per-interface rate grid); no point: one for every interface
    points = [(p["name"], p.get("interfaces")) for p in config.get("grid_points") or []] or [("", None)]
    names = [
        run_name(i, s, p)
        for p, only in points
        for i in config.get("interfaces", [])
        if only is None or i in only
        for s in config.get("seeds", [])
    ]
    root = sweep_dir / RUNS_DIR
    found = sorted(
        p.relative_to(root).as_posix()
        for pattern in ("*-s*", "*/*-s*")
        for p in root.glob(pattern)
        if p.is_dir() and p.name.rpartition("-s")[2].isdigit()
    )
    names += [n for n in found if n not in names]
    runs = []
    for name in names:
        point, _, leaf = name.rpartition("/")
        interface, _, seed = leaf.rpartition("-s")
        if not seed.isdigit() or not interface:
            continue
        directory = root / name
        runs.append(
            Run(
                interface=interface,
                seed=int(seed),
                directory=directory,
                point=point,
                status=fileio.read_json(directory / RUN_FILES["status"], default=None) or {},
                summary=fileio.read_json(directory / RUN_FILES["summary"], default=None),
                eval=fileio.read_json(directory / RUN_FILES["eval"], default=None),
            )
        )
    return runs
