"""The sweep directory's record of itself, ``compare.yaml``: the config as resolved, the dataset as used, the
shared recipe and the grid points. A sweep grows over several invocations (more interfaces, seeds, budgets or
rates), so the record is the union of them all; a directory whose record has another recipe is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tablefree.config_parsing import load_yaml, to_dict
from tablefree.fileio import write_text_atomic
from tablefree.rundir import SWEEP_CONFIG
from tablefree.sweep.config import CompareConfig, base_recipe
from tablefree.sweep.dataset import dataset_as_used


def write_sweep_config(config: CompareConfig, out: Path) -> None:
    """Record the sweep's config; refuse an output directory that holds a sweep with another recipe."""
    path = out / SWEEP_CONFIG
    data = to_dict(config)
    data["dataset"] = dataset_as_used(config)
    data["resolved_recipe"] = base_recipe(config)
    data["grid_points"] = [point.record() for point in config.grid.points()]
    if path.exists():
        previous = load_yaml(path)
        if "resolved_recipe" in previous and previous["resolved_recipe"] != data["resolved_recipe"]:
            raise ValueError(
                f"{out} holds a sweep with a different training recipe (see resolved_recipe in {path}); runs "
                "from two recipes must not be mixed: use another --out"
            )
        data["interfaces"] = _union(previous.get("interfaces", []), config.interfaces)
        data["seeds"] = _union(previous.get("seeds", []), config.seeds)
        data["grid_points"] = _union_points(previous.get("grid_points") or [], data["grid_points"], path)
    write_yaml_atomic(path, data)


def _union(first: list, second: list) -> list:
    return list(dict.fromkeys([*first, *second]))


def _union_points(first: list[dict], second: list[dict], path: Path) -> list[dict]:
    """Grid points of an earlier run of the sweep and of this one, in this config's order (then the earlier
    run's other points), so a budget added below the others is listed first, not last; a name may not change
    its settings."""
    merged = {p["name"]: dict(p) for p in first}
    for point in second:
        earlier = merged.get(point["name"])
        if earlier is not None and earlier["train"] != point["train"]:
            raise ValueError(
                f"grid point {point['name']} had other settings in {path} ({earlier['train']}); "
                "runs from two recipes must not be mixed: use another --out"
            )
        if earlier is None:
            merged[point["name"]] = dict(point)
        elif "interfaces" not in point:  # trained for every interface now
            earlier.pop("interfaces", None)
        elif "interfaces" in earlier:  # a rate listed for more interfaces later
            earlier["interfaces"] = _union(earlier["interfaces"], point["interfaces"])
    order = _union([p["name"] for p in second], [p["name"] for p in first])
    return [merged[name] for name in order]


def write_yaml_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
