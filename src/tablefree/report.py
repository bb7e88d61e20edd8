"""The comparison report of a sweep directory: ``report.md``, ``report.json`` and PNG figures.

A sweep directory (written by ``tablefree.compare.run_sweep``) holds ``compare.yaml`` (the resolved sweep
config) and ``runs/{interface}-s{seed}/``, each a training run directory (``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``checkpoints/``) plus the sweep's own files: ``eval.json`` (``tablefree.evaluate.run_eval``
results), ``eval_examples.jsonl`` (per-example records), ``status.json`` (done / failed, wall times) and, for a
failed run, ``error.txt``. ``build_report`` reads only these files, so a report can be rebuilt at any time
(``tablefree report SWEEP_DIR``), also from a partly finished sweep.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tablefree import stats
from tablefree.checkpoint import read_json as read_json_file
from tablefree.checkpoint import write_json_atomic, write_text_atomic
from tablefree.config import load_yaml

# One colour per interface in every figure (the Tableau palette's first three).
INTERFACE_COLORS = {"learned": "#1f77b4", "canonical": "#ff7f0e", "affine": "#2ca02c"}
FALLBACK_COLORS = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
INTERFACE_ORDER = ["learned", "canonical", "affine"]
VALIDATION_METRICS = ("val_loss", "val_ppl", "bits_per_byte")
RUN_FILES = {
    "summary": "summary.json",
    "metrics": "metrics.jsonl",
    "eval": "eval.json",
    "examples": "eval_examples.jsonl",
    "status": "status.json",
    "error": "error.txt",
}


@dataclass
class Run:
    """One (interface, seed) run of a sweep, as found on disk."""

    name: str
    interface: str
    seed: int
    directory: Path
    status: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None

    @property
    def state(self) -> str:
        return self.status.get("state", "done" if self.summary and self.eval else "incomplete")

    def metric_values(self) -> dict[str, float]:
        """Final per-run metrics, named ``task/metric`` (validation: ``validation/val_loss`` ...)."""
        values: dict[str, float] = {}
        for task, result in ((self.eval or {}).get("tasks") or {}).items():
            for metric, value in (result.get("metrics") or {}).items():
                if isinstance(value, (int, float)) and np.isfinite(value):
                    values[f"{task}/{metric}"] = float(value)
        if "validation/val_loss" not in values and self.summary and self.summary.get("final_val_loss"):
            loss = float(self.summary["final_val_loss"])
            values["validation/val_loss"] = loss
            values.setdefault("validation/val_ppl", float(np.exp(loss)))
        return values


def run_name(interface: str, seed: int) -> str:
    return f"{interface}-s{seed}"


def higher_is_better(metric: str) -> bool:
    name = metric.split("/")[-1].lower()
    return not any(word in name for word in ("loss", "ppl", "perplexity", "bits_per_byte", "bpb"))


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when the file does not exist."""
    try:
        return read_json_file(path)
    except FileNotFoundError:
        return None


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file ([] when it does not exist). A malformed last line is a record torn by an
    interrupted run and is dropped; a malformed line anywhere else is an error naming the file and line."""
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
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if index > 0 and index == len(numbered) - 1:
                continue
            raise ValueError(f"{path}:{number}: malformed JSON line") from None
    return rows


def sweep_config(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / "compare.yaml"
    return load_yaml(path) if path.exists() else {}


def find_runs(sweep_dir: str | Path) -> list[Run]:
    """The sweep's runs: those its config lists (in order), then any other ``runs/*-s*`` directories."""
    sweep_dir = Path(sweep_dir)
    config = sweep_config(sweep_dir)
    names = [run_name(i, s) for i in config.get("interfaces", []) for s in config.get("seeds", [])]
    found = sorted(p.name for p in (sweep_dir / "runs").glob("*-s*") if p.is_dir())
    names += [n for n in found if n not in names]
    runs = []
    for name in names:
        interface, _, seed = name.rpartition("-s")
        if not seed.isdigit():
            continue
        directory = sweep_dir / "runs" / name
        runs.append(
            Run(
                name=name,
                interface=interface,
                seed=int(seed),
                directory=directory,
                status=read_json(directory / RUN_FILES["status"]) or {},
                summary=read_json(directory / RUN_FILES["summary"]),
                eval=read_json(directory / RUN_FILES["eval"]),
            )
        )
    return runs


def ordered_interfaces(runs: list[Run]) -> list[str]:
    present = {run.interface for run in runs}
    return [i for i in INTERFACE_ORDER if i in present] + sorted(present - set(INTERFACE_ORDER))


def interface_colors(interfaces: list[str]) -> dict[str, str]:
    extra = iter(FALLBACK_COLORS * 4)
    return {i: INTERFACE_COLORS.get(i) or next(extra) for i in interfaces}


# ------------------------------------------------------------------------------------------------------------
# Statistics over runs


def per_example_scores(runs: list[Run], task: str, metric: str) -> dict[str, np.ndarray] | None:
    """For each interface, a (seeds, examples) matrix of a 0/1 (or numeric) per-example field, the columns
    aligned by ``doc_id`` over the examples that every run scored; None when any run lacks the field."""
    by_run: dict[str, dict[int, float]] = {}
    for run in runs:
        scores = {}
        for record in read_jsonl(run.directory / RUN_FILES["examples"]):
            if record.get("task") != task:
                continue
            value = record.get(metric)
            if not isinstance(value, (int, float)):  # bools count: JSON true/false are 1/0
                return None
            scores[int(record["doc_id"])] = float(value)
        if not scores:
            return None
        by_run[run.name] = scores
    common = sorted(set.intersection(*(set(s) for s in by_run.values())))
    if not common:
        return None
    matrices: dict[str, list[list[float]]] = {}
    for run in runs:
        matrices.setdefault(run.interface, []).append([by_run[run.name][d] for d in common])
    return {interface: np.array(rows) for interface, rows in matrices.items()}


def metric_table(runs: list[Run], interfaces: list[str]) -> dict[str, dict[str, Any]]:
    """Per metric: direction and, per interface, mean ± std over seeds and each seed's value."""
    names: list[str] = []
    for run in runs:
        names += [name for name in run.metric_values() if name not in names]
    names.sort(key=_metric_sort_key)
    table = {}
    for name in names:
        per_interface = {}
        for interface in interfaces:
            values = {
                run.seed: run.metric_values()[name]
                for run in runs
                if run.interface == interface and name in run.metric_values()
            }
            if values:
                mean, std = stats.mean_std(list(values.values()))
                per_interface[interface] = {"mean": mean, "std": std, "n": len(values), "values": values}
        table[name] = {"higher_is_better": higher_is_better(name), "per_interface": per_interface}
    return table


def _metric_sort_key(name: str) -> tuple[int, str]:
    task, _, metric = name.partition("/")
    if task == "validation":
        return (0, str(VALIDATION_METRICS.index(metric)) if metric in VALIDATION_METRICS else metric)
    return (1, name)


def comparisons(
    runs: list[Run], interfaces: list[str], table: dict[str, dict[str, Any]], n_boot: int
) -> list[dict[str, Any]]:
    """Every pair of interfaces × every metric: difference, 95% CI and the decision sentence."""
    out = []
    for name, entry in table.items():
        task, _, metric = name.partition("/")
        scores = None if task == "validation" else per_example_scores(_finished(runs), task, metric)
        for a, b in combinations(interfaces, 2):
            if a not in entry["per_interface"] or b not in entry["per_interface"]:
                continue
            if scores is not None and a in scores and b in scores:
                difference = stats.paired_bootstrap_diff(scores[a], scores[b], n_boot=n_boot)
            else:
                difference = stats.welch_diff(
                    list(entry["per_interface"][a]["values"].values()),
                    list(entry["per_interface"][b]["values"].values()),
                )
            sentence = stats.decide(difference, a, b, metric, entry["higher_is_better"])
            out.append({"metric": name, "a": a, "b": b, **difference.as_dict(), "sentence": sentence})
    return out


def _finished(runs: list[Run]) -> list[Run]:
    return [run for run in runs if run.eval is not None]


def seed_cv(table: dict[str, dict[str, Any]], metric: str = "validation/val_ppl") -> dict[str, float | None]:
    """Seed-to-seed coefficient of variation of ``metric`` per interface (None with fewer than two seeds)."""
    entry = table.get(metric, {"per_interface": {}})
    return {
        interface: stats.coefficient_of_variation(list(cell["values"].values())) if cell["n"] > 1 else None
        for interface, cell in entry["per_interface"].items()
    }


# ------------------------------------------------------------------------------------------------------------
# Provenance


def git_commit() -> dict[str, Any]:
    """The commit of the tablefree checkout (and whether it has uncommitted changes), when it is one."""
    from tablefree.evaluate.evaluator import git_commit as source_commit

    commit = source_commit()
    if commit is None:
        from tablefree import __version__

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
    import torch

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


# ------------------------------------------------------------------------------------------------------------
# The report


def build_report(sweep_dir: str | Path, n_boot: int | None = None) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and ``figures/*.png`` into ``sweep_dir``; return the JSON report."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory not found: {sweep_dir}")
    runs = find_runs(sweep_dir)
    if not runs:
        raise FileNotFoundError(f"{sweep_dir}: no runs (expected runs/{{interface}}-s{{seed}}/ directories)")
    config = sweep_config(sweep_dir)
    n_boot = n_boot or int(config.get("bootstrap", stats.DEFAULT_BOOTSTRAP))
    interfaces = ordered_interfaces(runs)
    table = metric_table(_finished(runs), interfaces)
    report = {
        "name": config.get("name", sweep_dir.name),
        "sweep_dir": str(sweep_dir.resolve()),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interfaces": interfaces,
        "seeds": sorted({run.seed for run in runs}),
        "runs": [_run_row(run) for run in runs],
        "params": _params(runs, interfaces),
        "headlines": headlines(runs),
        "metrics": table,
        "statistics": {
            "method": stats.__doc__,
            "bootstrap_replicates": n_boot,
            "cv_val_ppl": seed_cv(table),
            "comparisons": comparisons(runs, interfaces, table, n_boot),
        },
        "config": config,
        "train_config": _train_config(runs),
        "git": git_commit(),
        "environment": environment(),
    }
    figures_dir = sweep_dir / "figures"
    figures_dir.mkdir(exist_ok=True)
    colors = interface_colors(interfaces)
    report["figures"] = draw_figures(runs, report, colors, figures_dir)
    write_json_atomic(sweep_dir / "report.json", _json_ready(report))
    write_text_atomic(sweep_dir / "report.md", render_markdown(report))
    return report


def headlines(runs: list[Run]) -> dict[str, str]:
    """Each benchmark's headline metric, as the evaluation results name it."""
    found: dict[str, str] = {}
    for run in runs:
        for task, result in ((run.eval or {}).get("tasks") or {}).items():
            if result.get("headline") and task != "validation":
                found.setdefault(task, result["headline"])
    return found


def _run_row(run: Run) -> dict[str, Any]:
    summary, status = run.summary or {}, run.status
    return {
        "name": run.name,
        "interface": run.interface,
        "seed": run.seed,
        "state": run.state,
        "error": status.get("error"),
        "tokens_seen": summary.get("tokens_seen"),
        "train_wall_s": summary.get("wall_time_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "eval_wall_s": status.get("eval_wall_s"),
        "final_train_loss": summary.get("final_train_loss"),
        "final_val_loss": summary.get("final_val_loss"),
        "completed": summary.get("completed"),
        "metrics": run.metric_values(),
    }


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
        path = run.directory / "config.yaml"
        if path.exists():
            return load_yaml(path)
    return None


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


# ------------------------------------------------------------------------------------------------------------
# Markdown


def render_markdown(report: dict[str, Any]) -> str:
    sections = [
        _md_header(report),
        _md_verdict(report),
        _md_params(report),
        _md_metrics(report),
        _md_statistics(report),
        _md_figures(report),
        _md_runs(report),
        _md_provenance(report),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _md_header(report: dict[str, Any]) -> str:
    runs = report["runs"]
    done = sum(r["state"] == "done" for r in runs)
    lines = [
        f"# Interface comparison: {report['name']}",
        "",
        f"Interfaces: {', '.join(report['interfaces'])}; seeds: {', '.join(map(str, report['seeds']))}; "
        f"{done} of {len(runs)} runs finished. Generated {report['created']} by `tablefree report`.",
    ]
    failed = [r for r in runs if r["state"] == "failed"]
    for row in failed:
        lines.append(f"\n**Run {row['name']} failed**: {row['error'] or 'see its error.txt'}")
    lines += [f"\n> {note}" for note in report["config"].get("notes") or []]
    missing = [r["name"] for r in runs if r["state"] not in ("done", "failed")]
    if missing:
        lines.append(
            f"\nNot finished yet: {', '.join(missing)} (re-run `tablefree compare` to complete them)."
        )
    return "\n".join(lines)


def verdict(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparisons on the headline metrics: validation loss, bits per byte, each benchmark's headline."""
    return [c for c in report["statistics"]["comparisons"] if _is_headline(report, c["metric"])]


def _md_verdict(report: dict[str, Any]) -> str:
    comps = verdict(report)
    if not comps:
        return ""
    lines = [
        "## Verdict",
        "",
        "One sentence per comparison on the validation loss and each benchmark's headline:",
        "",
    ]
    lines += [f"- **{c['metric']}**: {c['sentence']}" for c in comps]
    return "\n".join(lines)


def _is_headline(report: dict[str, Any], metric: str) -> bool:
    task, _, name = metric.partition("/")
    if task == "validation":
        return name in ("val_loss", "bits_per_byte")
    return report["headlines"].get(task) == name


def _md_params(report: dict[str, Any]) -> str:
    if not report["params"]:
        return ""
    lines = [
        "## Parameters",
        "",
        "| interface | input interface | trainable total | learned-table total | removed vs learned | removed % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for interface, p in report["params"].items():
        lines.append(
            f"| {interface} | {p.get('input_interface', 0):,} | {p.get('total_trainable', 0):,} | "
            f"{p.get('learned_total', 0):,} | {p.get('removed_vs_learned', 0):,} | "
            f"{p.get('removed_percent', 0.0):.2f}% |"
        )
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 5) -> str:
    """``digits`` significant digits (7.9910 → 7.991, 2954.17 → 2954.2, 0.0553 → 0.0553)."""
    return "–" if value is None else f"{value:.{digits}g}"


def _md_metrics(report: dict[str, Any]) -> str:
    table = report["metrics"]
    if not table:
        return "## Results\n\nNo finished runs yet."
    interfaces = report["interfaces"]
    lines = [
        "## Results",
        "",
        "Mean ± sample std over seeds; each seed's value in brackets. ↑ higher is better, ↓ lower is better.",
        "",
        "| metric | " + " | ".join(interfaces) + " |",
        "|---|" + "---|" * len(interfaces),
    ]
    for name, entry in table.items():
        arrow = "↑" if entry["higher_is_better"] else "↓"
        cells = []
        for interface in interfaces:
            cell = entry["per_interface"].get(interface)
            if cell is None:
                cells.append("–")
                continue
            seeds = ", ".join(f"s{s}: {_fmt(v)}" for s, v in sorted(cell["values"].items()))
            cells.append(f"{_fmt(cell['mean'])} ± {_fmt(cell['std'])} [{seeds}]")
        lines.append(f"| {name} {arrow} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _md_statistics(report: dict[str, Any]) -> str:
    st = report["statistics"]
    lines = ["## Statistics", ""]
    cvs = st["cv_val_ppl"]
    if cvs:
        cells = ", ".join(
            f"{i}: {100 * v:.2f}%" if v is not None else f"{i}: – (one seed)" for i, v in cvs.items()
        )
        lines += [f"Seed-to-seed coefficient of variation of validation perplexity: {cells}.", ""]
    lines += [
        "Differences A − B with 95% confidence intervals. Benchmark metrics: paired bootstrap over the benchmark "
        f"examples combined with resampling of seeds ({st['bootstrap_replicates']} replicates, fixed RNG seed). "
        "Validation metrics and other per-run numbers: Welch t-interval over seeds (wide with few seeds; none with "
        "one seed). Method details: docs/experiments.md.",
        "",
        "| metric | A − B | difference | 95% CI | method | conclusion |",
        "|---|---|---:|---|---|---|",
    ]
    for c in st["comparisons"]:
        ci = f"[{_fmt(c['low'])}, {_fmt(c['high'])}]" if c["low"] is not None else "–"
        lines.append(
            f"| {c['metric']} | {c['a']} − {c['b']} | {c['estimate']:+.4f} | {ci} | {c['method']} | "
            f"{c['sentence']} |"
        )
    return "\n".join(lines)


def _md_figures(report: dict[str, Any]) -> str:
    figures = report.get("figures") or []
    if not figures:
        return ""
    lines = ["## Figures", ""]
    for figure in figures:
        lines += [f"![{figure['title']}]({figure['path']})", ""]
    return "\n".join(lines).rstrip()


def _md_runs(report: dict[str, Any]) -> str:
    lines = [
        "## Runs",
        "",
        "| run | state | tokens | train wall time | tokens/s | eval wall time | final train loss |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['name']} | {r['state']} | {_fmt_int(r['tokens_seen'])} | {_fmt_seconds(r['train_wall_s'])} | "
            f"{_fmt_int(r['tokens_per_s'])} | {_fmt_seconds(r['eval_wall_s'])} | {_fmt(r['final_train_loss'])} |"
        )
    return "\n".join(lines)


def _fmt_int(value: float | None) -> str:
    return "–" if value is None else f"{round(value):,}"


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _md_provenance(report: dict[str, Any]) -> str:
    git = report["git"]
    commit = git.get("commit") or f"unknown (tablefree {git.get('version')})"
    env = report["environment"]
    device = env.get("gpu", "CPU")
    lines = [
        "## Provenance",
        "",
        f"- git commit: `{commit}`" + (" (with uncommitted changes)" if git.get("dirty") else ""),
        f"- environment: Python {env['python']}, torch {env['torch']}, device {device}, "
        f"{env['cpu_count']} CPUs ({env['torch_threads']} torch threads), {env['platform']}",
        "",
        "Sweep config (`compare.yaml`):",
        "",
        "```yaml",
        yaml.safe_dump(report["config"], sort_keys=False).rstrip(),
        "```",
    ]
    if report["train_config"]:
        lines += [
            "",
            "Resolved training config of the first run (the other runs differ only in interface and seed):",
            "",
            "```yaml",
            yaml.safe_dump(report["train_config"], sort_keys=False).rstrip(),
            "```",
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Figures (matplotlib, Agg backend: no display needed)


def draw_figures(
    runs: list[Run], report: dict[str, Any], colors: dict[str, str], out_dir: Path
) -> list[dict]:
    """Loss curves, final metrics per seed, and pairwise differences with their intervals."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    figures = []
    for name, title, draw in (
        ("loss_curves.png", "Training and validation loss against tokens", _figure_loss_curves),
        ("final_metrics.png", "Final metrics per interface and seed", _figure_final_metrics),
        ("differences.png", "Pairwise differences with 95% confidence intervals", _figure_differences),
    ):
        figure = draw(runs, report, colors)
        if figure is None:
            continue
        figure.suptitle(f"{report['name']}: {title}", fontsize=13)
        _save_figure(figure, out_dir / name)
        figures.append({"path": f"figures/{name}", "title": title})
    return figures


def _save_figure(figure: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.stem}.tmp.{os.getpid()}.png")
    figure.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(figure)
    os.replace(tmp, path)


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


def _figure_loss_curves(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    import matplotlib.pyplot as plt

    rows = {run.name: read_jsonl(run.directory / RUN_FILES["metrics"]) for run in runs}
    if not any(rows.values()):
        return None
    figure, axes = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    max_tokens = max((r["tokens"] for rs in rows.values() for r in rs if "tokens" in r), default=1)
    for ax, key, label in (
        (axes[0], "train_loss", "training loss"),
        (axes[1], "val_loss", "validation loss"),
    ):
        scale = _token_axis(ax, max_tokens)
        window = 1
        for interface in report["interfaces"]:
            curves = []
            for run in runs:
                if run.interface != interface:
                    continue
                tokens, values = _curve(rows[run.name], key)
                if key == "train_loss" and len(values):
                    values, window = _smooth(values)
                curves.append((tokens, values))
            band = _seed_band(curves)
            if band is None:
                continue
            grid, mean, low, high = band
            n = len([c for c in curves if len(c[0])])
            marker = "o" if len(grid) <= 30 else None
            ax.plot(
                grid / scale,
                mean,
                color=colors[interface],
                marker=marker,
                label=f"{interface} (mean of {n} seeds)" if n > 1 else f"{interface} (1 seed)",
            )
            if n > 1:
                ax.fill_between(grid / scale, low, high, color=colors[interface], alpha=0.2, linewidth=0)
        smoothing = f", moving average of {window} logged steps" if window > 1 else ""
        ax.set_title(f"{label.capitalize()} (band: min–max over seeds{smoothing})", fontsize=10)
        ax.set_ylabel(f"{label} (nats per token)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, f"no {label} logged", ha="center", va="center", transform=ax.transAxes)
    return figure


def _headline_metrics(report: dict[str, Any]) -> list[str]:
    return [name for name in report["metrics"] if _is_headline(report, name)]


def _metric_label(name: str, higher: bool) -> str:
    units = {
        "val_loss": "nats per token",
        "val_ppl": "perplexity",
        "bits_per_byte": "bits per byte",
    }
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


def _figure_final_metrics(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    metrics = _headline_metrics(report)
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
            ax.scatter(
                x + jitter,
                values,
                color=colors[interface],
                alpha=0.6,
                s=28,
                label="seeds" if x == 0 else None,
            )
            ax.errorbar(
                x,
                cell["mean"],
                yerr=cell["std"],
                fmt="_",
                markersize=22,
                capsize=6,
                color=colors[interface],
                linewidth=2,
                label="mean ± std" if x == 0 else None,
            )
        ax.set_xticks(range(len(interfaces)), interfaces)
        ax.set_xlim(-0.6, len(interfaces) - 0.4)
        ax.set_xlabel("input interface")
        ax.set_ylabel(_metric_label(name, entry["higher_is_better"]), fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
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


def _figure_differences(runs: list[Run], report: dict[str, Any], colors: dict[str, str]) -> Any:
    metrics = _headline_metrics(report)
    comps = [c for c in report["statistics"]["comparisons"] if c["metric"] in metrics]
    if not comps:
        return None
    figure, axes = _grid(
        len(metrics), height=max(2.6, 1.2 + 0.7 * len(list(combinations(report["interfaces"], 2))))
    )
    for ax, name in zip(axes, metrics, strict=True):
        rows = [c for c in comps if c["metric"] == name]
        for y, c in enumerate(rows):
            color = "black" if c["excludes_zero"] else "grey"
            if c["low"] is not None:
                ax.plot([c["low"], c["high"]], [y, y], color=color, linewidth=2.5)
            else:
                ax.annotate(
                    "no interval (one seed)",
                    (c["estimate"], y),
                    xytext=(0, 7),
                    textcoords="offset points",
                    ha="center",
                    fontsize=8,
                    color=color,
                )
            ax.plot(c["estimate"], y, "o", color=color)
        ax.axvline(0.0, color="tab:red", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(rows)), [f"{c['a']} − {c['b']}" for c in rows])
        ax.set_ylim(len(rows) - 0.3, -0.7)  # first pair on top
        higher = report["metrics"][name]["higher_is_better"]
        ax.set_xlabel(f"difference A − B ({'higher' if higher else 'lower'} is better for A)", fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    handles = _legend_proxies(("o", "resolved: the 95% CI excludes 0"), color="black") + _legend_proxies(
        ("o", "not resolved: the 95% CI includes 0"), color="grey"
    )
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=9)
    return figure
