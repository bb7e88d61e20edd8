"""The report's statistics from run files written the way a sweep writes them (no training): the raw-data
sidecar rebuilds every validation interval and slope alone, and a trend needs enough points."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import yaml

from tablefree.report import build_report
from tablefree.report.data import DATA_FILE, statistics_from_data

DOCUMENTS = 12


def _write_run(
    root: Path, interface: str, seed: int, rng: np.random.Generator, points: int, gap: float
) -> None:
    directory = root / "runs" / f"{interface}-s{seed}"
    directory.mkdir(parents=True)
    tokens = np.full(DOCUMENTS, 500) + np.arange(DOCUMENTS) * 40
    per_token = 5.0 + gap + rng.normal(0, 0.05, DOCUMENTS)
    nats = per_token * tokens
    val_loss = float(nats.sum() / tokens.sum())
    validation = {
        "metrics": {"val_loss": val_loss, "val_ppl": math.exp(val_loss), "bits_per_byte": val_loss / 3},
        "tokens": int(tokens.sum()),
        "bytes": int(tokens.sum()) * 4,
        "n": 10,
        "per_document": {"documents": DOCUMENTS, "nats": nats.tolist(), "tokens": tokens.tolist()},
    }
    (directory / "eval.json").write_text(json.dumps({"tasks": {"validation": validation}}))
    (directory / "summary.json").write_text(json.dumps({"tokens_seen": 4096 * points, "params": {}}))
    (directory / "status.json").write_text(json.dumps({"state": "done"}))
    curve = [
        {
            "step": 4 * (i + 1),
            "tokens": 4096 * (i + 1),
            "train_loss": 6.0,
            "val_loss_estimate": 7 - 0.1 * i + gap,
        }
        for i in range(points)
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))


def _sweep(root: Path, points: int) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir()
    config = {"name": "synthetic", "interfaces": ["learned", "canonical", "affine"], "seeds": [0, 1, 2]}
    (root / "compare.yaml").write_text(yaml.safe_dump(config))
    for seed in range(3):
        for interface, gap in (("learned", 0.0), ("canonical", 0.3), ("affine", 0.32)):
            _write_run(root, interface, seed, rng, points, gap + 0.02 * seed * (interface == "affine"))
    return root


def test_report_data_rebuilds_every_interval_and_slope(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "sweep", points=8)
    report = build_report(sweep, n_boot=300)
    keep = tmp_path / "shipped"
    keep.mkdir()
    shutil.copy(sweep / "report.json", keep)
    shutil.copy(sweep / DATA_FILE, keep)
    shutil.rmtree(sweep)  # only the shipped files remain
    rebuilt = statistics_from_data(keep / DATA_FILE, n_boot=300)
    shipped = json.loads((keep / "report.json").read_text())["statistics"]
    keys = ("a", "b", "estimate", "low", "high", "se", "df", "seed_se", "p_value", "adjusted_p", "sentence")
    assert [{k: c[k] for k in keys} for c in rebuilt["comparisons"]] == [
        {k: c[k] for k in keys} for c in shipped["comparisons"]
    ]
    assert (
        len(shipped["comparisons"]) == 3 and report["statistics"]["comparisons"][0]["clusters"] == DOCUMENTS
    )
    assert [g["trend"] for g in rebuilt["gap"]] == [g["trend"] for g in shipped["gap"]]
    assert all(g["trend"] is not None for g in shipped["gap"])


def test_a_run_still_training_is_left_out_of_the_gap_curves(tmp_path: Path) -> None:
    """A run in progress has only its first few estimates: pairing it would cut its pair's curve to them."""
    from tablefree.report import comparison
    from tablefree.rundir import find_runs

    sweep = _sweep(tmp_path / "sweep", points=8)
    running = sweep / "runs" / "affine-s1"
    (running / "status.json").write_text(json.dumps({"state": "running"}))
    (running / "eval.json").unlink()
    records = (running / "metrics.jsonl").read_text().splitlines()
    (running / "metrics.jsonl").write_text("\n".join(records[:2]) + "\n")
    gaps = {
        (g["a"], g["b"]): g
        for g in comparison.gap_curves(find_runs(sweep), ["learned", "canonical", "affine"])
    }
    assert gaps[("learned", "affine")]["seeds"] == 2 and len(gaps[("learned", "affine")]["curve"]) == 8
    assert gaps[("learned", "canonical")]["seeds"] == 3


def test_the_primary_point_is_the_last_one_every_interface_ran(tmp_path: Path) -> None:
    """A rate grid per interface may end with a point that only one interface trains (canonical at 8e-3): the
    report's headline tables must come from the last point where every interface finished a run."""
    rng = np.random.default_rng(0)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    points = [{"name": "lr2e-3", "train": {"optim": {"lr": 2e-3}}}]
    points.append({"name": "lr8e-3", "train": {"optim": {"lr": 8e-3}}, "interfaces": ["canonical"]})
    config = {
        "name": "rates",
        "interfaces": ["learned", "canonical"],
        "seeds": [0, 1, 2],
        "grid_points": points,
    }
    (sweep / "compare.yaml").write_text(yaml.safe_dump(config))
    for point, interfaces in (("lr2e-3", ("learned", "canonical")), ("lr8e-3", ("canonical",))):
        staging = tmp_path / point
        for seed in range(3):
            for interface in interfaces:
                _write_run(staging, interface, seed, rng, 4, 0.3 * (interface == "canonical"))
        (sweep / "runs").mkdir(exist_ok=True)
        (staging / "runs").rename(sweep / "runs" / point)
    report = build_report(sweep, n_boot=200)
    assert report["primary_point"] == "lr2e-3"
    assert (
        "tables are at grid point lr2e-3, the last one at which every interface finished a run (not lr8e-3)"
        in (sweep / "report.md").read_text()
    )
    assert set(report["metrics"]["validation/val_loss"]["per_interface"]) == {"learned", "canonical"}


def test_no_trend_from_two_points(tmp_path: Path) -> None:
    from tablefree.report import comparison
    from tablefree.rundir import find_runs

    runs = find_runs(_sweep(tmp_path / "two", points=2))
    gaps = comparison.gap_curves(runs, ["learned", "canonical", "affine"])
    assert gaps and all(g["trend"] is None for g in gaps)
    assert "2 in-training evaluation points" in gaps[0]["no_trend"] and "≥ 5 points" in gaps[0]["no_trend"]
    report = build_report(tmp_path / "two", n_boot=100)  # the report says why, and still draws the points
    markdown = (tmp_path / "two" / "report.md").read_text()
    assert (
        "| learned − canonical | 3 | -0.300 | – | – | no trend: 2 in-training evaluation points" in markdown
    )
    assert "| growing |" not in markdown and "| shrinking |" not in markdown
    assert any(figure["path"] == "figures/gap.png" for figure in report["figures"])
    # five points from 4k to 20k tokens span a doubling over their last doubling (8k → 20k): a trend
    five = comparison.gap_curves(find_runs(_sweep(tmp_path / "five", points=5)), ["learned", "canonical"])
    assert five[0]["trend"] is None  # 8k, 12k, 16k, 20k: four points in the last doubling
    eight = comparison.gap_curves(find_runs(_sweep(tmp_path / "eight", points=10)), ["learned", "canonical"])
    assert eight[0]["trend"]["points"] == 6 and eight[0]["trend"]["from_tokens"] == 4096 * 5


def test_the_report_names_a_run_without_summary_and_a_curve_cut_short(tmp_path: Path) -> None:
    """#35: a deleted summary.json must not leave "3 of 3 finished" standing alone while the run drops out of the
    budget fits, and a truncated metrics.jsonl must be named and left out of the in-training curves instead of
    cutting every pair's curve short."""
    from tablefree.report import comparison
    from tablefree.rundir import find_runs

    sweep = _sweep(tmp_path / "sweep", points=8)
    for run in (sweep / "runs").iterdir():  # a finished run's summary records its last step
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "step": 32}))
    (sweep / "runs" / "canonical-s2" / "summary.json").unlink()
    cut = sweep / "runs" / "affine-s1" / "metrics.jsonl"
    cut.write_text("\n".join(cut.read_text().splitlines()[:3]) + "\n")
    runs = find_runs(sweep)
    accounting = comparison.run_accounting(runs)
    # #43: without its summary the run is not finished (as --status says), so in none of the tables
    assert accounting["finished"] == 8
    (not_used,) = accounting["done_not_finished"]
    assert not_used["run"] == "canonical-s2" and "summary.json is missing" in not_used["reason"]
    named = {row["run"]: row for row in accounting["left_out"]}
    assert set(named) == {"affine-s1"}
    assert named["affine-s1"]["reason"] == "metrics.jsonl ends at step 12 of 32 (cut short)"
    gaps = {(g["a"], g["b"]): g for g in comparison.gap_curves(runs, ["learned", "canonical", "affine"])}
    assert gaps[("learned", "affine")]["seeds"] == 2 and len(gaps[("learned", "affine")]["curve"]) == 8
    build_report(sweep, n_boot=100)
    markdown = (sweep / "report.md").read_text()
    assert "8 of 9 runs finished" in markdown and "- canonical-s2: summary.json is missing" in markdown
    assert "**Used in every part: 7 of the 8 finished runs.**" in markdown
    assert (
        "- affine-s1: metrics.jsonl ends at step 12 of 32 (cut short); left out of the in-training"
        in markdown
    )


def test_gap_figure_gives_each_budget_its_colour_legend_entry_and_band() -> None:
    """#35: four budgets were drawn in one colour with four identical legend entries, and the promised band was
    drawn for none of them."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.collections import PolyCollection

    from tablefree.report import figures

    def curve(n: int, offset: float) -> list[dict]:
        return [
            {
                "tokens": 1000.0 * (i + 1),
                "estimate": offset - 0.01 * i,
                "low": offset - 0.1,
                "high": offset + 0.1,
            }
            for i in range(n)
        ]

    points = ["1M", "2M", "4M", "8M"]
    gaps = [
        {"point": p, "a": "learned", "b": "canonical", "seeds": 3, "curve": curve(3, -0.1 * k), "trend": None}
        for k, p in enumerate(points)
    ]
    report = {"statistics": {"gap": gaps}}
    figure = figures._gap([], report, figures.interface_colors(["learned", "canonical"]))
    (ax,) = [a for a in figure.axes if a.get_visible()]
    lines = [line for line in ax.get_lines() if line.get_label() in {f"{p} (3 seeds)" for p in points}]
    assert len(lines) == 4 and len({line.get_color() for line in lines}) == 4
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 4
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 4
    assert "band: 95% t interval over seeds" in ax.get_title()


def test_predict_at_is_answered_with_the_fit_or_its_refusal() -> None:
    """#35: `report --predict-at 17B,100B` on a sweep whose fit is refused printed nothing about the request."""
    from tablefree.report.scaling_markdown import predict_at_answer
    from tablefree.scaling import Observation, ScalingReportSpec, scaling_report

    rows = [
        Observation(name, s, float(d), 5.0 + 0.3 * (name == "canonical") - 0.1 * i + 0.01 * s)
        for name in ("learned", "canonical")
        for s in range(3)
        for i, d in enumerate([1e6, 2e6, 4e6])
    ]
    fits = scaling_report(rows, ScalingReportSpec(predict_at=[17e9, 100e9], n_boot=20))
    report = {"statistics": {"fitted_curves": [{"fits": fits}]}}
    (line,) = predict_at_answer(report, [17e9, 100e9])
    assert line.startswith("Predictions at 17B, 100B tokens: none, the fit is refused: a fit needs 5 or more")
    (none,) = predict_at_answer({"statistics": {"fitted_curves": []}}, [17e9])
    assert "this sweep has no budget grid" in none
    assert predict_at_answer(report, None) == []
