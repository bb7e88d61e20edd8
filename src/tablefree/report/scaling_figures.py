"""Figures of the fitted scaling curves (matplotlib, Agg), drawn from ``tablefree.scaling.scaling_report``'s
dict and the observations it was built from: per fit, the loss against tokens (or parameters) with each seed's
points, the fitted curves and their bands; and each pair's gap against the budget with the extrapolation band
and the backtest marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tablefree import stats
from tablefree.report.figures import _save_figure, interface_colors
from tablefree.scaling import Observation, groups_by_tokens_per_param

EXTRAPOLATION_SHOWN = (
    4.0  # curves are drawn to this multiple of the largest budget (or the furthest prediction)
)


def draw_scaling_figures(
    report: dict[str, Any], observations: Sequence[Observation], out_dir: Path
) -> list[dict]:
    """Two PNGs per fit that was not refused, ``scaling_{loss,gap}_{what}.png`` in ``out_dir``; returns
    [{"path", "title"}] (paths relative to the report directory, as ``figures/NAME``)."""
    # matplotlib is imported where a figure is drawn: it is heavy, and only the verbs that draw need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    figures = []
    groups = [(g, _tokens_label(g)) for g in report["tokens"]] + [
        (g, f"{g['tokens_per_param']:g}-tokens-per-param") for g in report["params"]
    ]
    for group, label in groups:
        if group.get("refused"):
            continue
        points = _group_points(group, observations)
        for kind, draw, title in (
            (
                "loss",
                loss_figure,
                "Validation loss, fitted curves and 95% expanded percentile bands over seed resamples",
            ),
            ("gap", gap_figure, "The fitted gap, extrapolated, with the backtest"),
        ):
            figure = draw(group, points)
            if figure is None:  # one interface: no gap
                continue
            name = f"scaling_{kind}_{label}.png"
            _save_figure(figure, Path(out_dir) / name)
            figures.append({"path": f"figures/{name}", "title": f"{title} ({label.replace('-', ' ')})"})
    return figures


def loss_figure(group: dict[str, Any], observations: Sequence[Observation]) -> Any:
    """Loss against x (log axis) per interface: each seed's run as a point, the fit and its resampled band."""
    import matplotlib.pyplot as plt

    names = list(group["interfaces"])
    colors = interface_colors(names)
    x_name = group["x"]
    right = _right_edge(group)
    figure, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for name in names:
        fit = group["interfaces"][name]
        f = fit["fit"]
        _curve_with_band(
            ax,
            fit["curve"],
            right,
            colors[name],
            f"{name}: E = {f['E']['estimate']:.3g}, β = {f['beta']['estimate']:.3g}",
        )
        runs = [o for o in observations if o.interface == name]
        ax.scatter(
            [getattr(o, x_name) for o in runs], [o.loss for o in runs], color=colors[name], s=14, alpha=0.7
        )
    ax.axvline(group["largest"], color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (one run per point)" if x_name == "tokens" else "trainable parameters")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"seeds {', '.join(map(str, group['seeds']))}; dotted: the largest {_unit(group)} run")
    ax.legend(fontsize=8)
    return figure


def gap_figure(group: dict[str, Any], observations: Sequence[Observation]) -> Any:
    """None without a pair. Per pair: the fitted gap A − B against x with its band, the observed mean gaps, the region beyond the
    largest budget shaded as extrapolation, the backtest's prediction (with its interval) at the largest
    budget, and the crossing where the fits cross."""
    import matplotlib.pyplot as plt

    pairs = group["pairs"]
    if not pairs:
        return None
    right = _right_edge(group)
    level = f"{100 * group['confidence']:g}% expanded percentile"
    figure, axes = plt.subplots(
        1, len(pairs), figsize=(7 * len(pairs), 5), layout="constrained", squeeze=False
    )
    for ax, pair in zip(axes[0], pairs, strict=True):
        _curve_with_band(
            ax,
            pair["gap_curve"],
            right,
            "#1f77b4",
            "fitted gap",
            band_label=f"{level} band (seeds resampled)",
        )
        low, high = _measured_gap_intervals(group, pair, observations)
        ax.errorbar(
            group["budgets"],
            pair["observed_gap"],
            yerr=[np.subtract(pair["observed_gap"], low), np.subtract(high, pair["observed_gap"])],
            fmt="o",
            color="black",
            markersize=4,
            capsize=3,
            zorder=3,
            label=f"measured mean gap, {100 * group['confidence']:g}% t interval over seeds",
        )
        ax.axvspan(group["largest"], right, color="grey", alpha=0.1, label="extrapolation")
        bt = pair["backtest"]
        ax.errorbar(
            [bt["at"]],
            [bt["predicted"]],
            yerr=[[bt["predicted"] - bt["low"]], [bt["high"] - bt["predicted"]]],
            fmt="D",
            color="#d62728",
            capsize=4,
            zorder=4,
            label=f"backtest: fit to {bt['fitted_up_to']:.3g}, predicted (check {'passed' if bt['covered'] else 'failed'})",
        )
        parity = pair["parity"]
        if parity["estimate"] is not None and parity["estimate"] <= right:
            ax.axvline(
                parity["estimate"], color="#2ca02c", linestyle="--", linewidth=1, label="the fits cross"
            )
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training tokens" if group["x"] == "tokens" else "trainable parameters")
        ax.set_ylabel(f"{pair['a']} − {pair['b']} validation loss (nats/token)")
        ax.set_title(f"{pair['a']} − {pair['b']} (below 0: {pair['a']} ahead)")
        ax.legend(fontsize=8)
    return figure


def _curve_with_band(
    ax: Any,
    curve: dict[str, list[float]],
    right: float,
    color: str,
    label: str,
    band_label: str | None = None,
) -> None:
    """A fitted curve ({x, estimate, low, high}) up to ``right`` with its resampled band beneath it."""
    xs = np.array(curve["x"])
    shown = xs <= right
    ax.fill_between(
        xs[shown],
        np.array(curve["low"])[shown],
        np.array(curve["high"])[shown],
        color=color,
        alpha=0.2,
        linewidth=0,
        label=band_label,
    )
    ax.plot(xs[shown], np.array(curve["estimate"])[shown], color=color, label=label)


def _right_edge(group: dict[str, Any]) -> float:
    furthest = max(
        [group["largest"]]
        + [p["x"] for fit in group["interfaces"].values() for p in fit.get("predictions", [])]
    )
    return min(group["horizon"], max(EXTRAPOLATION_SHOWN * group["largest"], furthest * 1.2))


def _measured_gap_intervals(
    group: dict[str, Any], pair: dict[str, Any], observations: Sequence[Observation]
) -> tuple[list[float], list[float]]:
    """Per budget of the fit, the measured gap's paired-by-seed t interval (the fit's seeds, which ran every
    budget for every interface)."""
    x_name = group["x"]
    loss = {(o.interface, o.seed, getattr(o, x_name)): o.loss for o in observations}
    low, high = [], []
    for x in group["budgets"]:
        a = [loss[(pair["a"], seed, x)] for seed in group["seeds"]]
        b = [loss[(pair["b"], seed, x)] for seed in group["seeds"]]
        difference = stats.paired_seed_difference(a, b, confidence=group["confidence"])
        low.append(difference.low)
        high.append(difference.high)
    return low, high


def _group_points(group: dict[str, Any], observations: Sequence[Observation]) -> list[Observation]:
    """The observations the fit used: its seeds and budgets, and its size (or tokens-per-parameter ratio)."""
    seeds, budgets = set(group["seeds"]), set(group["budgets"])
    if group["x"] == "tokens":
        keep = [o for o in observations if o.params == group["params"] and o.tokens in budgets]
    else:
        with_params = [o for o in observations if o.params is not None]
        keep = next(
            (g for ratio, g in groups_by_tokens_per_param(with_params) if ratio == group["tokens_per_param"]),
            [],
        )
        keep = [o for o in keep if o.params in budgets]
    return [o for o in keep if o.seed in seeds]


def _tokens_label(group: dict[str, Any]) -> str:
    return "tokens" if group["params"] is None else f"tokens-at-{group['params']:.3g}-params"


def _unit(group: dict[str, Any]) -> str:
    return "budget" if group["x"] == "tokens" else "model"
