"""The learning-rate check of a sweep whose grid lists rates (``grid.lr``): per interface, the loss at each rate
and the rate chosen, and each pair's gap at one shared rate beside the gap at each interface's own best rate.

The choice is made on the *selection split* (the training windows every run held out, ``data.select_every``;
``selection.json`` in each run), never on the validation split that gives the verdicts. A new sweep with rates
always has one (``tablefree.sweep.plan.check_plans``); for a sweep directory from before that check, without a
selection split, the in-training estimate decides, and the report says that this reads windows of the
validation split.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tablefree import stats
from tablefree.evaluate.selection import (
    MIN_SELECTION_TOKENS,
    MIN_SELECTION_WINDOWS,
    selection_split_shortfall,
)
from tablefree.fileio import read_json
from tablefree.report import comparison
from tablefree.rundir import RUN_FILES, Run
from tablefree.sweep.grid import RATE, recorded_points, same_except
from tablefree.units import human

SELECTION_FILE = RUN_FILES["selection"]  # written by compare beside eval.json
OWN_RATE = "own best rate"


def learning_rate_checks(
    runs: list[Run], config: dict[str, Any], interfaces: list[str], n_boot: int, controls: list[str]
) -> list[dict[str, Any]]:
    """One entry per group of grid points that differ only in their learning rate (usually one group)."""
    groups: dict[str, list[tuple[float, str]]] = {}
    for point in recorded_points(config):
        if point.rate is None:
            continue
        groups.setdefault(same_except(point.train, RATE), []).append((float(point.rate), point.name))
    checks = []
    for members in groups.values():
        if len({rate for rate, _ in members}) < 2:
            continue
        check = _check(sorted(members), comparison.finished(runs), interfaces, n_boot, controls)
        if check is not None:
            checks.append(check)
    return checks


def _check(
    members: list[tuple[float, str]],
    runs: list[Run],
    interfaces: list[str],
    n_boot: int,
    controls: list[str],
) -> dict[str, Any] | None:
    rates = [rate for rate, _ in members]
    point_of = {rate: name for rate, name in members}
    here = [run for run in runs if run.point in point_of.values()]
    if not here:
        return None
    source = _selection_source(here)
    per_interface: dict[str, Any] = {}
    for interface in interfaces:
        cells = {}
        for rate in rates:
            mine = [r for r in here if r.interface == interface and r.point == point_of[rate]]
            losses = {r.seed: value for r in mine if (value := _selection_loss(r, source)) is not None}
            if not losses:
                continue
            mean, std = stats.mean_std(list(losses.values()))
            validation = [
                r.metric_values()[comparison.VAL_LOSS]
                for r in mine
                if comparison.VAL_LOSS in r.metric_values()
            ]
            cells[rate] = {
                "mean": mean,
                "std": std,
                "n": len(losses),
                "values": losses,
                "val_loss": float(np.mean(validation)) if validation else None,
            }
        if not cells:
            continue
        complete = max(cell["n"] for cell in cells.values())
        # choose among the rates every seed finished: a rate with fewer seeds is not yet comparable
        eligible = {rate: cell for rate, cell in cells.items() if cell["n"] == complete}
        chosen = min(eligible, key=lambda rate: eligible[rate]["mean"])
        per_interface[interface] = {
            "rates": cells,
            "chosen": chosen,
            "at_edge": chosen in (rates[0], rates[-1]),
            "seeds": complete,
        }
    if not per_interface:
        return None
    # the one rate that serves every interface best on average (only rates every interface has)
    common = [rate for rate in rates if all(rate in cell["rates"] for cell in per_interface.values())]
    shared = (
        min(
            common, key=lambda rate: np.mean([cell["rates"][rate]["mean"] for cell in per_interface.values()])
        )
        if common
        else None
    )
    own_points = {interface: point_of[cell["chosen"]] for interface, cell in per_interface.items()}
    tuned_runs = [run for run in here if own_points.get(run.interface) == run.point]
    ordered = [i for i in interfaces if i in per_interface]
    at_shared = (
        comparison.comparisons(
            [r for r in here if r.point == point_of[shared]], ordered, n_boot, point_of[shared], controls
        )
        if shared is not None
        else []
    )
    at_own = comparison.comparisons(tuned_runs, ordered, n_boot, OWN_RATE, controls)
    return {
        "rates": rates,
        "points": [name for _, name in members],
        "selection": source,
        "per_interface": per_interface,
        "shared_rate": shared,
        "shared_point": point_of.get(shared) if shared is not None else None,
        "own_points": own_points,
        "comparisons": {
            "shared": [c for c in at_shared if c["metric"] == comparison.VAL_LOSS],
            "own": [c for c in at_own if c["metric"] == comparison.VAL_LOSS],
        },
    }


def _selection_source(runs: list[Run]) -> dict[str, Any]:
    """What the choice is made on: the selection split when every run has one, else the in-training estimate."""
    found = [read_json(run.directory / SELECTION_FILE, default=None) for run in runs]
    if found and all(isinstance(entry, dict) and "selection_loss" in entry for entry in found):
        first = found[0]
        # a sweep from before check_selection_split's minimum may have chosen on a handful of windows
        too_small = selection_split_shortfall(int(first["windows"]), int(first["tokens"]))
        return {
            "name": "selection split",
            "description": (
                f"the selection split: every {first['select_every']}th training window, held out of training "
                f"and disjoint from the validation split ({first['windows']:,} windows, "
                f"{human(first['tokens'])} tokens)"
            ),
            "disjoint_from_verdict": True,
            "too_small": (
                f"{too_small}; a rate is chosen on at least {MIN_SELECTION_WINDOWS} windows and "
                f"{MIN_SELECTION_TOKENS:,} tokens (re-run with a lower data.select_every)"
                if too_small
                else None
            ),
        }
    return {
        "name": "in-training estimate",
        "description": (
            "the trainer's final in-training validation estimate (no selection split: set data.select_every); "
            "it reads windows of the validation split, so the verdict at the chosen rates is not fully "
            "independent of the choice"
        ),
        "disjoint_from_verdict": False,
    }


def _selection_loss(run: Run, source: dict[str, Any]) -> float | None:
    if source["name"] == "selection split":
        entry = read_json(run.directory / SELECTION_FILE, default=None) or {}
        value = entry.get("selection_loss")
        return float(value) if isinstance(value, (int, float)) else None
    return run.final_estimate()
