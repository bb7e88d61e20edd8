"""What tells a sweep's runs apart, in one place: a run is (grid point, interface, seed); a grid point sets the
model size, the learning rate and/or the token budget over the shared recipe; the interface's own options (a
fixed code's ``scale``, say) stay as the recipe sets them. The sweep (plans, branching) and the report (fitted
curves, the rate check) both group runs and points with ``same_except``, so "differ only in their budget" means
one thing everywhere.

Below the rest of ``tablefree.sweep`` and below ``tablefree.report``: it imports neither.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

MODEL_ABBREVIATIONS = {"d_model": "d", "n_layers": "l", "n_heads": "h", "d_ff": "ff", "preset": ""}

# the fields a grid point may set, as dotted recipe paths
MODEL = "model"
RATE = "optim.lr"
BUDGET = "budget"


@dataclass
class GridPoint:
    """One point of a grid: its directory name, its recipe overrides and the interfaces it trains (None: every
    interface of the sweep; a per-interface rate grid trains a rate only for the interfaces that list it)."""

    name: str
    # {"model": {...}, "optim": {"lr": ...}, "budget": ...}, each only where the grid sets it
    train: dict[str, Any]
    interfaces: list[str] | None = None

    @property
    def budget(self) -> str | int | None:
        return self.train.get(BUDGET)

    @property
    def rate(self) -> float | None:
        return (self.train.get("optim") or {}).get("lr")

    def record(self) -> dict[str, Any]:
        """The point as ``compare.yaml``'s ``grid_points`` records it."""
        record: dict[str, Any] = {"name": self.name, "train": self.train}
        if self.interfaces is not None:
            record["interfaces"] = self.interfaces
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> GridPoint:
        return cls(record["name"], record.get("train") or {}, record.get("interfaces"))


def recorded_points(sweep_config: dict[str, Any]) -> list[GridPoint]:
    """The grid points a sweep directory's ``compare.yaml`` records ([] without a grid)."""
    return [GridPoint.from_record(p) for p in sweep_config.get("grid_points") or []]


def same_except(settings: dict[str, Any], *fields: str) -> str:
    """A key that is equal for two recipes (or two points' overrides) exactly when they differ at most in
    ``fields`` (dotted paths, e.g. ``optim.lr``)."""
    rest = copy.deepcopy(settings)
    for path in fields:
        *parents, leaf = path.split(".")
        node = rest
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return yaml.safe_dump(rest, sort_keys=True)


def point_name(model: dict[str, Any] | None, budget: str | int | None, lr: float | None = None) -> str:
    """A grid point's directory name: ``d256-l8-lr2e-3-2.5M`` (or the model's own ``name``)."""
    parts = []
    if model:
        parts.append(
            str(model["name"])
            if "name" in model
            else "-".join(f"{MODEL_ABBREVIATIONS.get(k, k)}{v}" for k, v in model.items())
        )
    if lr is not None:
        parts.append(f"lr{rate_name(lr)}")
    if budget is not None:
        parts.append(str(budget).replace(" ", ""))
    return "-".join(parts).replace("/", "_")


def rate_name(lr: float) -> str:
    """``2e-3`` for 0.002, ``1.5e-3`` for 0.0015: short, exact for the rates a grid lists."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def run_recipe(recipe: dict[str, Any], interface: str, seed: int) -> dict[str, Any]:
    """The recipe of one run: the point's recipe with only the interface name and the seed changed (the
    interface's other options, e.g. ``scale``, as the recipe sets them)."""
    run = copy.deepcopy(recipe)
    model = run.setdefault("model", {})
    spec = model.get("interface")
    spec = {"name": spec} if isinstance(spec, str) else dict(spec or {})
    spec["name"] = interface
    model["interface"] = spec
    run["seed"] = seed
    return run
