"""The report's PNG figures (matplotlib, Agg backend: no display needed), drawn from the runs and the report
dict. Colours are fixed per interface in every figure: learned blue, canonical orange, affine green."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tablefree.fileio import atomic_path
from tablefree.report.comparison import VAL_LOSS, curve_cut_short, estimate_curve
from tablefree.rundir import Run
from tablefree.units import human

INTERFACE_COLORS = {"learned": "#1f77b4", "canonical": "#ff7f0e", "affine": "#2ca02c"}
FALLBACK_COLORS = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
TIE_TOLERANCE = 1e-12  # |value| below this is floating-point noise around an exact tie, drawn as 0


def interface_colors(interfaces: list[str]) -> dict[str, str]:
    extra = iter(FALLBACK_COLORS * 4)
    return {i: INTERFACE_COLORS.get(i) or next(extra) for i in interfaces}


def draw_figures(runs: list[Run], report: dict[str, Any], out_dir: Path) -> list[dict]:
    """Loss curves, final metrics per seed, the paired differences, the gap against tokens, and (for a grid)
    validation loss against tokens and parameters. Returns [{"path", "title"}] of the figures drawn."""
    # matplotlib is imported where a figure is drawn: it is heavy, and only the verbs that draw need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    colors = interface_colors(report["interfaces"])
    figures = []
    for name, title, draw in (
        ("loss_curves.png", "Training loss and in-training validation estimate against tokens", _loss_curves),
        ("final_metrics.png", "Final metrics per interface and seed", _final_metrics),
        ("differences.png", "Paired differences with 95% confidence intervals", _differences),
        ("gap.png", "The paired validation gap as training grows", _gap),
        ("scaling.png", "Validation loss against tokens and parameters", _scaling),
    ):
        figure = draw(runs, report, colors)
        if figure is None:
            continue
        if isinstance(figure, tuple):  # a figure that drew less than the usual title says names what it drew
            figure, title = figure
        figure.suptitle(f"{report['name']}: {title}", fontsize=13)
        _save_figure(figure, out_dir / name)
        figures.append({"path": f"figures/{name}", "title": title})
    return figures


def _save_figure(figure: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path, suffix=path.suffix) as tmp:  # savefig reads the format from the suffix
        figure.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(figure)


def _plain_axis(ax: Any, axis: str = "x") -> None:
    """Numbers at their true scale: no offset ("1e−17") and no scientific multiplier on the axis."""
    getattr(ax, f"{axis}axis").get_major_formatter().set_useOffset(False)
    ax.ticklabel_format(axis=axis, style="plain", useOffset=False)


def _primary_runs(runs: list[Run], report: dict[str, Any]) -> list[Run]:
    return [run for run in runs if run.point == report["primary_point"]]


# ------------------------------------------------------------------------------------------------------------


def _curve(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = sorted(
        (row["tokens"], row[key])
        for row in rows
        if isinstance(row.get(key), (int, float)) and isinstance(row.get("tokens"), (int, float))
    )
    if not points:
        return np.empty(0), np.empty(0)
    tokens, values = np.array(points, dtype=np.float64).T
    return tokens, values


def _smooth(values: np.ndarray) -> tuple[np.ndarray, int]:
    """A trailing moving average over ~2% of the points (training loss is noisy batch to batch)."""
    window = max(1, len(values) // 50)
    if window == 1:
        return values, 1
    kernel = np.ones(window) / window
    head = np.cumsum(values[: window - 1]) / np.arange(1, window)
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")]), window


def _seed_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...] | None:
    """Mean, min and max over seeds on a common token grid (the shortest run's points, in the shared range)."""
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return None
    end = min(c[0][-1] for c in curves)
    grid = min((c[0][c[0] <= end] for c in curves), key=len)
    stacked = np.stack([np.interp(grid, tokens, values) for tokens, values in curves])
    return grid, stacked.mean(axis=0), stacked.min(axis=0), stacked.max(axis=0)


def _token_axis(ax: Any, max_tokens: float) -> float:
    scale, unit = (
        (1e9, "billions")
        if max_tokens >= 1e9
        else (1e6, "millions")
        if max_tokens >= 1e6
        else (1e3, "thousands")
    )
    ax.set_xlabel(f"tokens seen ({unit})")
    return scale


def _loss_curves(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    import matplotlib.pyplot as plt

    # a run whose metrics.jsonl was cut short would cut every band short: the report names it (run_accounting)
    runs = [run for run in _primary_runs(runs, report) if curve_cut_short(run) is None]
    rows = {run.name: run.metrics_records() for run in runs}
    if not any(rows.values()):
        return None
    figure, axes = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    max_tokens = max((r["tokens"] for rs in rows.values() for r in rs if "tokens" in r), default=1)
    estimates = {run.name: estimate_curve(run) for run in runs}
    for ax, key, label in (
        (axes[0], "train_loss", "training loss"),
        (axes[1], None, "in-training validation estimate"),
    ):
        scale = _token_axis(ax, max_tokens)
        window = 1
        for interface in report["interfaces"]:
            curves = []
            for run in (r for r in runs if r.interface == interface):
                if key is None:
                    points = sorted(estimates[run.name].items())
                    tokens, values = np.array(points).T if points else (np.empty(0), np.empty(0))
                else:
                    tokens, values = _curve(rows[run.name], key)
                    if len(values):
                        values, window = _smooth(values)
                curves.append((tokens, values))
            band = _seed_band(curves)
            if band is None:
                continue
            grid, mean, low, high = band
            n = len([c for c in curves if len(c[0])])
            ax.plot(
                grid / scale,
                mean,
                color=colors[interface],
                marker="o" if len(grid) <= 30 else None,
                label=f"{interface} (mean of {n} seeds)" if n > 1 else f"{interface} (1 seed)",
            )
            if n > 1:
                ax.fill_between(grid / scale, low, high, color=colors[interface], alpha=0.2, linewidth=0)
        baseline = report.get("baseline")
        if key is None and baseline:
            ax.axhline(
                baseline["val_loss"], color="black", linestyle=":", linewidth=1, label="unigram baseline"
            )
        smoothing = f", moving average of {window} logged steps" if window > 1 else ""
        ax.set_title(f"{label.capitalize()} (band: min–max over seeds{smoothing})", fontsize=10)
        ax.set_ylabel(f"{label} (nats per token)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, f"no {label} logged", ha="center", va="center", transform=ax.transAxes)
    return figure


def _question_names(report: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(c["metric"] for c in report["statistics"]["comparisons"])) or (
        [VAL_LOSS] if VAL_LOSS in report["metrics"] else []
    )


def _metric_label(name: str, higher: bool) -> str:
    units = {"val_loss": "nats per token", "val_ppl": "perplexity", "bits_per_byte": "bits per byte"}
    metric = name.partition("/")[2]
    unit = units.get(metric, "fraction correct" if metric.startswith("acc") else "value")
    return f"{metric} ({unit}; {'higher' if higher else 'lower'} is better)"


def _grid(count: int, width: float = 4.6, height: float = 3.8) -> tuple[Any, list[Any]]:
    import matplotlib.pyplot as plt

    columns = 2 if count == 4 else min(3, count)
    rows = (count + columns - 1) // columns
    figure, axes = plt.subplots(
        rows, columns, figsize=(width * columns, height * rows), squeeze=False, layout="constrained"
    )
    flat = list(axes.ravel())
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def _final_metrics(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    metrics = [m for m in _question_names(report) if m in report["metrics"]]
    if not metrics:
        return None
    figure, axes = _grid(len(metrics))
    interfaces = report["interfaces"]
    for ax, name in zip(axes, metrics, strict=True):
        entry = report["metrics"][name]
        for x, interface in enumerate(interfaces):
            cell = entry["per_interface"].get(interface)
            if cell is None:
                continue
            values = list(cell["values"].values())
            jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
            ax.scatter(x + jitter, values, color=colors[interface], alpha=0.6, s=28)
            ax.errorbar(
                x,
                cell["mean"],
                yerr=cell["std"] if cell["std"] is not None else None,
                fmt="_",
                markersize=22,
                capsize=6,
                color=colors[interface],
                linewidth=2,
            )
        ax.set_xticks(range(len(interfaces)), interfaces)
        ax.set_xlim(-0.6, len(interfaces) - 0.4)
        ax.set_xlabel("input interface")
        ax.set_ylabel(_metric_label(name, entry["higher_is_better"]), fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        _plain_axis(ax, "y")
    handles = _legend_proxies(("o", "one seed"), ("_", "mean ± std over seeds"))
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=9)
    return figure


def _legend_proxies(*items: tuple[str, str], color: str = "dimgrey") -> list[Any]:
    from matplotlib.lines import Line2D

    return [
        Line2D(
            [],
            [],
            color=color,
            marker=marker,
            markersize=12 if marker == "_" else 6,
            linestyle="",
            label=label,
        )
        for marker, label in items
    ]


def _clean(value: float | None) -> float | None:
    return None if value is None else (0.0 if abs(value) < TIE_TOLERANCE else value)


def _differences(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    comps = report["statistics"]["comparisons"]
    metrics = _question_names(report)
    if not comps:
        return None
    pairs_per_metric = max(sum(c["metric"] == m for c in comps) for m in metrics)
    figure, axes = _grid(len(metrics), height=max(2.6, 1.2 + 0.7 * pairs_per_metric))
    for ax, name in zip(axes, metrics, strict=True):
        rows = [c for c in comps if c["metric"] == name]
        widths = [abs(_clean(c["estimate"]) or 0) for c in rows]
        widths += [abs(_clean(v) or 0) for c in rows for v in (c["low"], c["high"])]
        span = max(widths) or 1.0  # an axis of all ties still needs a width
        for y, c in enumerate(rows):
            estimate, low, high = _clean(c["estimate"]), _clean(c["low"]), _clean(c["high"])
            color = {"resolved": "black", "at chance": "tab:purple"}.get(c["verdict"], "grey")
            if low is None:
                _note(ax, estimate, y, "no interval (one seed)", color)
            elif low == high == estimate:
                _note(ax, estimate, y, "tie: identical scores" if estimate == 0 else "no spread", color)
            else:
                ax.plot([low, high], [y, y], color=color, linewidth=2.5)
            ax.plot(estimate, y, "o", color=color)
        ax.axvline(0.0, color="tab:red", linestyle="--", linewidth=1)
        ax.set_xlim(-1.15 * span, 1.15 * span)
        _plain_axis(ax, "x")
        label = lambda c: f"{c['point'] + ': ' if c['point'] else ''}{c['a']} − {c['b']}"  # noqa: E731
        ax.set_yticks(range(len(rows)), [label(c) for c in rows])
        ax.set_ylim(len(rows) - 0.3, -0.7)  # first pair on top
        higher = rows[0]["higher_is_better"] if rows else True
        ax.set_xlabel(f"difference A − B ({'higher' if higher else 'lower'} is better for A)", fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    handles = (
        _legend_proxies(("o", "resolved"), color="black")
        + _legend_proxies(("o", "not resolved"), color="grey")
        + _legend_proxies(("o", "at chance: no verdict"), color="tab:purple")
    )
    figure.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=9)
    return figure


def _note(ax: Any, x: float, y: float, text: str, color: str) -> None:
    ax.annotate(text, (x, y), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8, color=color)


def _gap(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    """Per compared pair, the in-training gap of each grid point: one colour per point (a budget grid's points
    are ordered by budget, light to dark), its 95% t band over seeds wherever it has two or more seeds, and
    points without a trend reading left unjoined."""
    gaps = report["statistics"]["gap"]
    if not gaps:
        return None
    pairs = list(dict.fromkeys((g["a"], g["b"]) for g in gaps))
    figure, axes = _grid(len(pairs), width=5.2)
    max_tokens = max(p["tokens"] for g in gaps for p in g["curve"])
    points = list(dict.fromkeys(g["point"] for g in gaps))
    for ax, (a, b) in zip(axes, pairs, strict=True):
        scale = _token_axis(ax, max_tokens)
        point_colors = _point_colors(points, colors[b])
        unjoined = False
        drawn: set[str] = set()  # what the title must describe: "band", "bars", "none"
        for g in (g for g in gaps if (g["a"], g["b"]) == (a, b)):
            tokens = np.array([p["tokens"] for p in g["curve"]]) / scale
            estimate = np.array([p["estimate"] for p in g["curve"]])
            color = point_colors[g["point"]]
            # points without a trend reading (too few, or spanning less than a doubling) are drawn unjoined
            unjoined |= not g.get("trend")
            ax.plot(
                tokens,
                estimate,
                linestyle="-" if g.get("trend") else "none",
                marker="o",
                markersize=3 if g.get("trend") else 5,
                color=color,
                label=f"{g['point'] or 'gap'} ({g['seeds']} seed{'s' if g['seeds'] != 1 else ''})",
            )
            if all(p["low"] is not None for p in g["curve"]):
                low = [p["low"] for p in g["curve"]]
                high = [p["high"] for p in g["curve"]]
                if len(tokens) > 1:
                    drawn.add("band")
                    ax.fill_between(tokens, low, high, color=color, alpha=0.2, linewidth=0)
                else:  # one point: a band would have no width
                    drawn.add("bars")
                    ax.errorbar(
                        tokens, estimate, yerr=[estimate - low, high - estimate], fmt="none", color=color
                    )
            else:
                drawn.add("none")
        ax.axhline(0.0, color="tab:red", linestyle="--", linewidth=1)
        ax.set_ylabel(f"{a} − {b} (nats per token)", fontsize=9)
        ax.set_title(f"{a} − {b}: in-training validation estimate\n({_interval_note(drawn)})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(
            fontsize=8, title="unjoined: too few points for a trend" if unjoined else None, title_fontsize=8
        )
    return figure


def _interval_note(drawn: set[str]) -> str:
    """What the gap panel draws around its points, in its subtitle: a band, error bars, or neither."""
    shapes = [name for key, name in (("band", "band"), ("bars", "bars")) if key in drawn]
    notes = [f"{' and '.join(shapes)}: 95% t interval over seeds"] if shapes else []
    if "none" in drawn:
        notes.append("no interval: one seed" if shapes else "no band: one seed")
    return "; ".join(notes)


def _point_colors(points: list[str], single: str) -> dict[str, str]:
    """One colour per grid point: ``single`` for a sweep of one point, else light to dark along the points."""
    if len(points) == 1:
        return {points[0]: single}
    import matplotlib

    from_map = matplotlib.colormaps["viridis"]
    return {
        point: matplotlib.colors.to_hex(from_map(0.85 * (1 - i / (len(points) - 1))))
        for i, point in enumerate(points)
    }


def _scaling(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    """Validation loss against tokens seen and against trainable parameters, one panel per axis along which the
    grid's points differ: a grid of budgets at one model size has one parameter count per interface, and a
    panel of it would be vertical lines over one tick, so it is left out and the title says why."""
    rows = report["statistics"]["grid"]
    if len(rows) < 2:
        return None
    import matplotlib.pyplot as plt

    panels, omitted = [], []
    for key, label in (("tokens", "tokens seen"), ("params", "trainable parameters")):
        values = {
            interface: {row["interfaces"][interface][key] for row in rows if interface in row["interfaces"]}
            for interface in report["interfaces"]
        }
        if any(len(v - {None, 0}) > 1 for v in values.values()):
            panels.append((key, label))
        else:
            counts = ", ".join(
                f"{interface} {human(next(iter(v)))}" for interface, v in values.items() if v - {None, 0}
            )
            what = "budget" if key == "tokens" else "model size"
            omitted.append(f"one {what} per interface" + (f" ({counts})" if counts else ""))
    if not panels:
        return None
    figure, axes = plt.subplots(
        1, len(panels), figsize=(max(8, 6 * len(panels)), 4.6), layout="constrained", squeeze=False
    )
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        for interface in report["interfaces"]:
            cells = sorted(
                (row["interfaces"][interface][key], row["interfaces"][interface]["val_loss"])
                for row in rows
                if interface in row["interfaces"] and row["interfaces"][interface][key]
            )
            if cells:
                x, y = np.array(cells).T
                ax.plot(x, y, "o-", color=colors[interface], label=interface)
        ax.set_xlabel(f"{label} (log scale)")
        ax.set_ylabel("validation loss (evaluation over the split, nats/token)", fontsize=9)
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    shown = " and ".join("tokens" if key == "tokens" else "parameters" for key, _ in panels)
    title = f"Validation loss against {shown}"
    if omitted:
        left_out = "parameters" if panels[0][0] == "tokens" else "tokens"
        title += f" (not against {left_out}: {'; '.join(omitted)})"
    return figure, title
