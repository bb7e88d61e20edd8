"""The analysis inside ``tablefree compare`` (``analysis: true``): every finished run analysed into
``RUN/analysis/``, with the ``learned`` run of the same seed (and grid point) as reference, and one markdown
section for the sweep's report that sets the interfaces side by side, layer by layer, averaged over seeds.

A ``learned`` run gets the ``learned`` run of the next seed as reference, so the report also shows what two
learned tables of different seeds share: the ceiling for the fixed codes' CKA and neighbour overlap.

Duck-typed on the sweep's run records (``name``, ``interface``, ``seed``, ``directory``, optional ``point``,
and for planned runs ``recipe``), so that compare and report need only call these functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tablefree import stats
from tablefree.analysis.run import KNN_K, METHOD_VERSION, run_analysis
from tablefree.analysis.spec import DEFAULT_POSITIONS, AnalyzeSpec
from tablefree.checkpoint.layout import resolve_checkpoint
from tablefree.fileio import read_json

ANALYSIS_DIR = "analysis"


def reference_for(run: Any, runs: Sequence[Any], finished: set[str]) -> Any | None:
    """The finished ``learned`` run of the same grid point and seed; for a ``learned`` run, that of the next
    seed (cyclically); None when there is none."""
    point = getattr(run, "point", "")
    learned = sorted(
        (
            r
            for r in runs
            if r.interface == "learned" and getattr(r, "point", "") == point and r.name in finished
        ),
        key=lambda r: r.seed,
    )
    if run.interface != "learned":
        return next((r for r in learned if r.seed == run.seed), None)
    others = [r for r in learned if r.seed != run.seed]
    return next((r for r in others if r.seed > run.seed), others[0] if others else None)


def analyze_runs(
    runs: Sequence[Any],
    finished: Iterable[str],
    device: str = "cpu",
    log: Callable[[str], None] = print,
    positions: int = DEFAULT_POSITIONS,
    mlp_probe: bool = False,
) -> dict[str, str]:
    """Analyse each finished run into ``RUN/analysis`` (skipped when an analysis of the same checkpoint
    against the same reference, by the current method, with the MLP probe if ``mlp_probe``, is there); returns
    run name → ``done``/``skipped``/``failed``. A failed analysis is logged and recorded, never raised: it must
    not sink the sweep."""
    finished = set(finished)
    outcome = {}
    for run in runs:
        if run.name not in finished:
            continue
        reference = reference_for(run, runs, finished)
        out = Path(run.directory) / ANALYSIS_DIR
        if _up_to_date(out, run.directory, reference.directory if reference else None, mlp_probe):
            outcome[run.name] = "skipped"
            continue
        log(f"[analysis] {run.name}" + (f" against {reference.name}" if reference else ""))
        try:
            spec = AnalyzeSpec(
                run.directory,
                reference=reference.directory if reference else None,
                data=(getattr(run, "recipe", None) or {}).get("data", {}).get("dir"),
                out=out,
                device=device,
                positions=positions,
                mlp_probe=mlp_probe,
            )
            run_analysis(spec)
            outcome[run.name] = "done"
        except Exception as error:  # reported and recorded; the sweep goes on
            log(f"[analysis] {run.name}: FAILED ({type(error).__name__}: {error})")
            outcome[run.name] = "failed"
    return outcome


def _up_to_date(out: Path, directory: Path, reference: Path | None, mlp_probe: bool = False) -> bool:
    previous = read_json(out / "analysis.json") if (out / "analysis.json").exists() else None
    if not previous or previous.get("method_version") != METHOD_VERSION:
        return False  # none yet, or made by an earlier method (uncontrolled probes, biased CKA): redone
    if mlp_probe and "mlp_probes" not in previous:
        return False
    wanted = str(resolve_checkpoint(reference)) if reference is not None else None
    recorded = (previous.get("reference") or {}).get("checkpoint")
    return previous.get("checkpoint") == str(resolve_checkpoint(directory)) and recorded == wanted


# ------------------------------------------------------------------------------------------------------------
# The report's section

# (path in analysis.json, title, shown as a percentage) of the per-layer tables, averaged over seeds
_MEASURES = (
    (
        ("probes", "code_sets", "canonical", "mean_accuracy"),
        "Canonical-bit linear probe accuracy (mean over bits)",
        True,
    ),
    (
        ("probes", "code_sets", "canonical", "selectivity"),
        "Canonical bits, linear probe: selectivity (accuracy − the untrained model's, same interface and seed)",
        True,
    ),
    (
        ("probes", "code_sets", "interface", "mean_accuracy"),
        "The interface's own code: linear probe accuracy",
        True,
    ),
    (
        ("probes", "code_sets", "interface", "selectivity"),
        "The interface's own code, linear probe: selectivity (accuracy − the untrained model's)",
        True,
    ),
    (
        ("probes", "code_sets", "random labels", "mean_accuracy"),
        "Control: random per-type labels, linear probe accuracy",
        True,
    ),
    # the MLP probe's rows appear only for runs analysed with it (``mlp_probe``)
    (
        ("mlp_probes", "code_sets", "canonical", "mean_accuracy"),
        "Canonical-bit MLP probe accuracy (mean over bits)",
        True,
    ),
    (
        ("mlp_probes", "code_sets", "canonical", "selectivity"),
        "Canonical bits, MLP probe: selectivity (accuracy − the untrained model's, same interface and seed)",
        True,
    ),
    (
        ("mlp_probes", "code_sets", "random labels", "mean_accuracy"),
        "Control: random per-type labels, MLP probe accuracy",
        True,
    ),
    (
        ("embeddings", "cka_reference_table"),
        "Debiased linear CKA of E_ℓ with the reference learned table",
        False,
    ),
    (
        ("embeddings", "cka_reference_table_null95"),
        "Its permutation null (95th percentile, rows shuffled): CKA at or below this says nothing",
        False,
    ),
    (
        ("embeddings", "knn_overlap", "values"),
        f"{KNN_K}-NN overlap of E_ℓ with the reference learned table",
        True,
    ),
    (("embeddings", "frequency_r2"), "Log-frequency R² read from E_ℓ (held out)", False),
)


def load_sweep_analyses(runs: Sequence[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """(run, analysis) for the runs that have ``RUN/analysis/analysis.json``."""
    found = []
    for run in runs:
        path = Path(run.directory) / ANALYSIS_DIR / "analysis.json"
        if path.exists():
            found.append((run, read_json(path)))
    return found


def sweep_analysis(runs: Sequence[Any], report_dir: str | Path) -> dict[str, Any] | None:
    """The report's analysis summary (JSON-ready): per grid point and measure, per layer and interface the
    mean, min and max over seeds; and each analysed run's analysis.md relative to ``report_dir``. None when
    no run has an analysis."""
    analyses = load_sweep_analyses(runs)
    if not analyses:
        return None
    points = []
    for point in dict.fromkeys(getattr(run, "point", "") for run, _ in analyses):
        here = [(run, result) for run, result in analyses if getattr(run, "point", "") == point]
        measures = [_measure(here, keys, title, percent) for keys, title, percent in _MEASURES]
        chances = [
            r["embeddings"]["knn_overlap"]["chance"] for _, r in here if "knn_overlap" in r["embeddings"]
        ]
        for measure in measures:
            if measure is not None and "NN overlap" in measure["title"] and chances:
                measure["title"] += f" (chance ≈ {100 * sum(chances) / len(chances):.1f}%)"
        points.append({"name": point, "measures": [m for m in measures if m is not None]})
    links = [
        {
            "run": run.name,
            "analysis": Path(
                os.path.relpath(Path(run.directory) / ANALYSIS_DIR / "analysis.md", Path(report_dir))
            ).as_posix(),
        }
        for run, _ in analyses
    ]
    return {"points": points, "runs": links}


def _dig(result: dict[str, Any], keys: tuple[str, ...]) -> list[float | None] | None:
    value: Any = result
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, list) else None


def _measure(
    pairs: list[tuple[Any, dict[str, Any]]], keys: tuple[str, ...], title: str, percent: bool
) -> dict[str, Any] | None:
    per_interface: dict[str, list[list[float | None]]] = {}
    for run, result in pairs:
        series = _dig(result, keys)
        if series is not None:
            per_interface.setdefault(run.interface, []).append(series)
    if not per_interface:
        return None
    depth = max(len(series) for per_seed in per_interface.values() for series in per_seed)
    layers = []
    for layer in range(depth):
        cells = {}
        for interface, per_seed in per_interface.items():
            values = [s[layer] for s in per_seed if layer < len(s) and s[layer] is not None]
            cells[interface] = _over_seeds(values) if values else None
        layers.append(cells)
    return {"title": title, "percent": percent, "interfaces": list(per_interface), "layers": layers}


def _over_seeds(values: list[float]) -> dict[str, Any]:
    """Mean, range and 95% t interval over seeds (no interval from one seed)."""
    mean, std = stats.mean_std(values)
    cell = {"mean": mean, "min": min(values), "max": max(values), "n": len(values), "low": None, "high": None}
    if std is not None:
        half = stats.student_t_ppf(0.975, len(values) - 1) * std / len(values) ** 0.5
        cell["low"], cell["high"] = mean - half, mean + half
    return cell


def sweep_analysis_markdown(summary: dict[str, Any] | None, level: int = 2) -> str:
    """The report's analysis section from :func:`sweep_analysis`: one table per measure (layers × interfaces,
    mean over seeds with the range), then a link to each run's analysis.md. Empty for None."""
    if not summary:
        return ""
    hashes = "#" * level
    lines = [
        f"{hashes} Analysis: what the layers build from the input",
        "",
        "From `tablefree analyze` on every finished run (docs/analysis.md). Reference: the `learned` run of the "
        "same seed; a `learned` run is compared with the `learned` run of another seed (the ceiling). Cells: "
        "mean over seeds (95% t interval over seeds) [min, max]; layer 0 is the interface output, layer ℓ the "
        "state after block ℓ. Probes are linear (ridge) unless titled MLP, and type-disjoint unless the run's "
        "analysis says otherwise; read each probe against its controls (selectivity, random labels) and each "
        "CKA against its null.",
    ]
    for point in summary["points"]:
        if point["name"]:
            lines += ["", f"{hashes}# {point['name']}"]
        for measure in point["measures"]:
            interfaces = measure["interfaces"]
            lines += ["", f"**{measure['title']}**", ""]
            lines.append("| layer | " + " | ".join(f"`{name}`" for name in interfaces) + " |")
            lines.append("|" + "---|" * (len(interfaces) + 1))
            for layer, cells in enumerate(measure["layers"]):
                row = [_cell(cells.get(name), measure["percent"]) for name in interfaces]
                lines.append(f"| {layer} | " + " | ".join(row) + " |")
    lines += ["", "Per run (tables, neighbours of probe words, figures):", ""]
    lines += [f"- [{link['run']}]({link['analysis']})" for link in summary["runs"]]
    return "\n".join(lines)


def _cell(cell: dict[str, Any] | None, percent: bool) -> str:
    if cell is None:
        return "–"
    scale, digits, unit = (100.0, 1, "%") if percent else (1.0, 3, "")
    text = f"{scale * cell['mean']:.{digits}f}{unit}"
    if cell.get("low") is not None:
        text += f" ({scale * cell['low']:.{digits}f} to {scale * cell['high']:.{digits}f})"
    if cell["n"] > 1:
        text += f" [{scale * cell['min']:.{digits}f}, {scale * cell['max']:.{digits}f}]"
    return text
