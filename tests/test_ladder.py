"""The ladder across model sizes (``tablefree ladder``) and the contrast it rests on (``stats.contrast_difference``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tablefree import stats
from tablefree.cli import main
from tablefree.report.ladder import ladder_data, ladder_report, write_ladder

DOCS = 20
RATIOS = {"7.5": 7.5, "15": 15.0, "30": 30.0}


def _record(point: str, interface: str, seed: int, tokens: int, learned_total: int, nats, doc_tokens) -> dict:
    return {
        "name": f"{point}/{interface}-s{seed}",
        "point": point,
        "interface": interface,
        "seed": seed,
        "state": "done",
        "tokens_seen": tokens,
        "params": {"learned_total": learned_total, "input_interface": 1000 if interface == "learned" else 0},
        "validation": {
            "metrics": {"val_loss": float(np.sum(nats) / np.sum(doc_tokens))},
            "tokens": int(np.sum(doc_tokens)),
            "bytes": int(2 * np.sum(doc_tokens)),
            "n": 1,
            "per_document": {
                "documents": DOCS,
                "nats": list(map(float, nats)),
                "tokens": list(map(int, doc_tokens)),
            },
        },
        "curve": [{"step": 1, "tokens": 4096, "train_loss": 9.0}],
    }


def write_rung(
    directory: Path, n_layers: int, gaps: dict[str, float], seeds: int = 3, noise: float = 0.01, rates=(4e-3,)
) -> Path:
    """A rung's report directory: learned and canonical at three budgets (7.5/15/30 tokens per learned
    parameter), canonical's loss above learned's by gaps[ratio] per token plus seed and document noise; each rate
    past the first adds a canonical point 0.05 better."""
    shared_rng = np.random.default_rng(0)  # one validation set for every rung
    doc_tokens = shared_rng.integers(1_000, 3_000, DOCS)
    doc_effect = shared_rng.normal(0.0, 0.05, DOCS)
    rng = np.random.default_rng(n_layers)
    learned_total = 10_000 * n_layers
    runs, points = [], []
    for index, (ratio_name, ratio) in enumerate(RATIOS.items()):
        for rate_index, rate in enumerate(rates):
            point, tokens = f"lr{rate:g}-b{index}", int(ratio * learned_total)
            points.append({"name": point, "train": {"budget": tokens, "optim": {"lr": rate}}})
            base = 4.0 - 0.3 * index  # the learned loss falls with the budget
            arms = [("learned", 0.0), ("canonical", -gaps[ratio_name])]
            if rate_index:
                arms = [("canonical", -gaps[ratio_name] - 0.05)]
            for seed in range(seeds):
                shared = rng.normal(0.0, noise)  # a seed's initialisation, shared by both interfaces
                for interface, offset in arms:
                    per_token = base + offset + shared + doc_effect + rng.normal(0.0, noise, DOCS)
                    nats = per_token * doc_tokens
                    runs.append(_record(point, interface, seed, tokens, learned_total, nats, doc_tokens))
    directory.mkdir(parents=True)
    model = {"n_layers": n_layers, "d_model": 64}
    report = {"name": f"rung-{n_layers}", "config": {"train": {"model": model}, "grid_points": points}}
    if len(rates) > 1:  # the rate check per budget, as report.json's statistics.learning_rate holds it
        report["statistics"] = {
            "learning_rate": [_rate_check(index, rates, seeds) for index in range(len(RATIOS))]
        }
    (directory / "report.json").write_text(json.dumps(report))
    names = [p["name"] for p in points]
    data = {"format": "tablefree-report-data/1", "baselines": [], "grid_points": names, "runs": runs}
    (directory / "report_data.json").write_text(json.dumps(data))
    return directory


def _rate_check(budget: int, rates, seeds: int) -> dict:
    """Canonical's 0.05 better rate chosen at the largest budget only (the smaller ones choose the first rate):
    the ladder must take the largest budget's choice for every ratio."""
    canonical = rates[1] if budget == len(RATIOS) - 1 else rates[0]
    return {
        "points": [f"lr{rate:g}-b{budget}" for rate in rates],
        "selection": {"name": "selection split", "too_small": None},
        "per_interface": {
            "learned": {"chosen": rates[0], "seeds": seeds, "at_edge": True, "rates": {str(rates[0]): {}}},
            "canonical": {
                "chosen": canonical,
                "seeds": seeds,
                "at_edge": True,
                "rates": {str(rate): {} for rate in rates},
            },
        },
    }


def test_contrast_of_two_groups_is_the_change_of_their_paired_gaps():
    rng = np.random.default_rng(1)
    w = rng.integers(100, 500, DOCS).astype(float)
    a = rng.normal(-0.2, 0.03, (3, DOCS)) * w
    b = rng.normal(-0.1, 0.03, (4, DOCS)) * w
    step = stats.contrast_difference([a, b], w, [-1.0, 1.0], n_boot=500)
    gap_a = stats.paired_difference(a, np.zeros_like(a), w, n_boot=0).estimate
    gap_b = stats.paired_difference(b, np.zeros_like(b), w, n_boot=0).estimate
    assert step.estimate == pytest.approx(gap_b - gap_a)
    assert step.low < step.estimate < step.high
    assert step.seeds == 7 and step.seed_df is not None and 2 <= step.seed_df <= 5  # Welch over 2 + 3 df
    with pytest.raises(ValueError, match="≥2 seeds in every group"):
        stats.contrast_difference([a, b[:1]], w, [-1.0, 1.0])
    with pytest.raises(ValueError, match="one coefficient each"):
        stats.contrast_difference([a, b], w, [1.0])


@pytest.mark.slow
def test_contrast_interval_covers_the_true_change_in_simulation():
    """Separate seed groups with seed, document and interaction noise: the 95% interval of the step covers the
    true step in at least ~93% of 400 simulated ladders (binomial sd 1.1%)."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 400
    for trial in range(trials):
        w = rng.integers(500, 4000, DOCS).astype(float)
        doc = rng.normal(0, 0.04, DOCS)  # shared by both groups: cancels in the step
        groups = []
        for truth in (-0.10, -0.06):
            seed_effect = rng.normal(0, 0.02, (3, 1))
            per_token = (
                truth + doc * (1 + 0.5 * rng.normal(0, 1)) + seed_effect + rng.normal(0, 0.03, (3, DOCS))
            )
            groups.append(per_token * w)
        step = stats.contrast_difference(groups, w, [-1.0, 1.0], n_boot=200, seed=trial)
        covered += step.low <= 0.04 <= step.high
    assert covered / trials >= 0.93


def test_least_squares_weights_give_the_slope():
    x = np.log2([2.0, 4.0, 8.0])
    y = np.array([0.3, 0.1, -0.1])
    assert float(stats.least_squares_weights(x) @ y) == pytest.approx(np.polyfit(x, y, 1)[0])
    with pytest.raises(ValueError, match="distinct"):
        stats.least_squares_weights([3.0, 3.0])


def test_ladder_resolves_a_lead_that_shrinks_with_depth(tmp_path: Path):
    gaps = {
        2: -0.30,
        4: -0.20,
        8: -0.10,
    }  # learned − canonical at every ratio: the lead shrinks 0.1 per doubling
    dirs = [write_rung(tmp_path / f"l{n}", n, {r: g for r in RATIOS}) for n, g in gaps.items()]
    report = write_ladder(tmp_path / "ladder", ladder_data(dirs[::-1]), n_boot=500)  # rungs sorted by depth
    assert [r["name"] for r in report["rungs"]] == ["2 layers", "4 layers", "8 layers"]
    top = next(e for e in report["across"] if e["ratio"] == 30.0)
    slope = top["per_doubling_of_layers"]
    assert slope["estimate"] == pytest.approx(0.10, abs=0.02) and slope["excludes_zero"]
    assert [s["estimate"] for s in top["steps"]] == pytest.approx([0.10, 0.10], abs=0.03)
    assert "shrinks (resolved)" in report["answer"] and report["answer"].startswith("At 30 tokens")
    row = report["rungs"][0]["ratios"][2]
    assert row["tokens_per_param"] == pytest.approx(30.0) and row["gaps"]["canonical"]["estimate"] < -0.25
    assert row["compute"] == pytest.approx(6 * (20_000 - 1000) * 600_000)
    assert report["rungs"][0]["table_share"] == pytest.approx(1000 / 20_000)
    # every number recomputes from the ladder's own raw data
    data = json.loads((tmp_path / "ladder" / "report_data.json").read_text())
    assert ladder_report(data, n_boot=500) == json.loads((tmp_path / "ladder" / "report.json").read_text())
    assert (tmp_path / "ladder" / "figures" / "ladder.png").stat().st_size > 10_000
    assert "**At 30 tokens per parameter" in (tmp_path / "ladder" / "report.md").read_text()


def test_two_rungs_give_a_step_and_refuse_a_trend(tmp_path: Path):
    dirs = [write_rung(tmp_path / f"l{n}", n, {r: -0.2 for r in RATIOS}) for n in (2, 4)]
    report = ladder_report(ladder_data(dirs), n_boot=300)
    entry = report["across"][0]
    assert "per_doubling_of_layers" not in entry and "a slope needs 3" in entry["trend_refused"]
    assert "does not change measurably" in report["answer"]


def test_ladder_refuses_a_rung_without_the_ratio_or_with_other_documents(tmp_path: Path):
    dirs = [write_rung(tmp_path / f"l{n}", n, {r: -0.2 for r in RATIOS}) for n in (2, 4)]
    with pytest.raises(
        ValueError,
        match=r"l2/report_data.json: no finished budget at 60 tokens .* lr0.004-b2: 30.00 at lr 0.004",
    ):
        ladder_data(dirs, ratios=(7.5, 60.0))
    with pytest.raises(ValueError, match="at least two rungs"):
        ladder_data(dirs[:1])
    data = ladder_data(dirs)
    for run in data["rungs"][1]["runs"]:
        run["validation"]["per_document"]["tokens"][0] += 1
    with pytest.raises(ValueError, match="l4: its validation documents differ"):
        ladder_report(data, n_boot=100)


def test_a_rung_with_rates_is_compared_at_the_named_rate(tmp_path: Path):
    dirs = [write_rung(tmp_path / "l2", 2, {r: -0.3 for r in RATIOS}, rates=(4e-3, 8e-3))]
    dirs.append(write_rung(tmp_path / "l4", 4, {r: -0.2 for r in RATIOS}))
    with pytest.raises(
        ValueError, match=r"2 points at 7.5 tokens .*lr0.004-b0 at lr 0.004, lr0.008-b0 at lr 0.008"
    ):
        ladder_data(dirs)
    with pytest.raises(ValueError, match=r"at peak rate 0\.008"):
        ladder_data(dirs, rate=8e-3)  # the 4-layer rung has no 8e-3 point
    report = ladder_report(ladder_data(dirs, rate=4e-3), n_boot=200)
    assert report["rungs"][0]["rates"] == {"7.5": 4e-3, "15": 4e-3, "30": 4e-3}
    gap = report["rungs"][0]["ratios"][2]["gaps"]["canonical"]["estimate"]
    assert gap == pytest.approx(-0.3, abs=0.02)  # the 4e-3 canonical runs, not the better 8e-3 ones


def test_own_rates_compare_each_interface_at_its_rungs_choice(tmp_path: Path):
    """--rate own: each interface at the rate chosen at its rung's largest budget, at every ratio; a rung
    without a rate check at its one rate, said to be unchecked."""
    dirs = [write_rung(tmp_path / "l2", 2, {r: -0.3 for r in RATIOS}, rates=(4e-3, 8e-3))]
    dirs.append(write_rung(tmp_path / "l4", 4, {r: -0.2 for r in RATIOS}))
    data = ladder_data(dirs, rate="own")
    report = ladder_report(data, n_boot=200)
    two, four = report["rungs"]
    assert two["rates"] == {r: {"learned": 4e-3, "canonical": 8e-3} for r in RATIOS}
    assert two["rate_choice"]["checked"] and two["rate_choice"]["points"] == ["lr0.004-b2", "lr0.008-b2"]
    for row in two["ratios"]:  # the better 8e-3 canonical runs: the lead is 0.25, not 0.3
        assert row["gaps"]["canonical"]["estimate"] == pytest.approx(-0.25, abs=0.02)
        assert row["point"] == {"learned": row["point"]["learned"], "canonical": row["point"]["canonical"]}
        assert row["point"]["canonical"].startswith("lr0.008") and row["point"]["learned"].startswith(
            "lr0.004"
        )
        assert row["loss"]["learned"]["seeds"] == row["loss"]["canonical"]["seeds"] == 3
    assert not four["rate_choice"]["checked"] and four["rates"]["30"] == {"learned": 4e-3, "canonical": 4e-3}
    step = next(e for e in report["across"] if e["ratio"] == 30.0)["steps"][0]
    assert step["estimate"] == pytest.approx(0.05, abs=0.03)  # -0.25 → -0.2
    assert report["answer"].endswith(
        "Each interface at its own rate; not checked on 4 layers (its one rate)."
    )
    write_ladder(tmp_path / "out", data, n_boot=200)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert (
        "learned 0.004 (its only rate: not chosen); canonical 0.008 of {0.004, 0.008} on 3 seeds" in markdown
    )
    assert "chosen on the selection split" in markdown and "no rate check in its report" in markdown
    with pytest.raises(ValueError, match="expected a number or 'own'"):
        ladder_data(dirs, rate="best")


def test_own_rates_refuse_an_unrated_interface_and_points_of_other_budgets(tmp_path: Path):
    dirs = [write_rung(tmp_path / "l2", 2, {r: -0.3 for r in RATIOS}, rates=(4e-3, 8e-3))]
    dirs.append(write_rung(tmp_path / "l4", 4, {r: -0.2 for r in RATIOS}))
    report_path = dirs[0] / "report.json"
    original = report_path.read_text()
    report = json.loads(original)
    for check in report["statistics"]["learning_rate"]:
        del check["per_interface"]["canonical"]
    report_path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match="rated learned, not canonical"):
        ladder_data(dirs, rate="own")
    report_path.write_text(original)
    data_path = dirs[0] / "report_data.json"
    runs = json.loads(data_path.read_text())
    for run in runs["runs"]:  # canonical's own 8e-3 runs 4% shorter: within the ratio's 5%, not one budget
        if run["point"].startswith("lr0.008"):
            run["tokens_seen"] = int(run["tokens_seen"] * 0.96)
    data_path.write_text(json.dumps(runs))
    with pytest.raises(ValueError, match="trained different budgets"):
        ladder_data(dirs, rate="own")


def write_rate_check(directory: Path, n_layers: int, ratio: float, chosen: dict[str, float]) -> Path:
    """A rate check swept apart from its rung: the rung's body at one budget, seed 0, rates 4e-3 and 8e-3."""
    learned_total = 10_000 * n_layers
    tokens = int(ratio * learned_total)
    points = [f"lr{rate:g}-check" for rate in (4e-3, 8e-3)]
    runs = [
        {
            "name": f"{point}/{interface}-s0",
            "point": point,
            "interface": interface,
            "seed": 0,
            "state": "done",
            "tokens_seen": tokens,
        }
        for point in points
        for interface in chosen
    ]
    cells = {
        interface: {"chosen": rate, "seeds": 1, "at_edge": False, "rates": {"0.004": {}, "0.008": {}}}
        for interface, rate in chosen.items()
    }
    check = {
        "points": points,
        "selection": {"name": "selection split", "too_small": None},
        "per_interface": cells,
    }
    directory.mkdir(parents=True)
    model = {"n_layers": n_layers, "d_model": 64}
    report = {
        "name": f"check-{n_layers}",
        "config": {"train": {"model": model}},
        "statistics": {"learning_rate": [check]},
    }
    (directory / "report.json").write_text(json.dumps(report))
    (directory / "report_data.json").write_text(json.dumps({"runs": runs}))
    return directory


def test_own_rates_read_a_rate_check_swept_apart_from_its_rung(tmp_path: Path):
    """A rung trained at one rate whose check ran as a sweep of its own (its body, its largest budget): the check
    is read for that rung, which is then checked; a check that chose a rate the rung did not train, one at another
    budget, or one of no rung's body is refused."""
    dirs = [write_rung(tmp_path / "l2", 2, {r: -0.3 for r in RATIOS}, rates=(4e-3, 8e-3))]
    dirs.append(write_rung(tmp_path / "l4", 4, {r: -0.2 for r in RATIOS}))
    same = write_rate_check(tmp_path / "check4", 4, 30.0, {"learned": 4e-3, "canonical": 4e-3})
    data = ladder_data(dirs, rate="own", rate_checks=[same])
    choice = data["rungs"][1]["rate_choice"]
    assert (
        choice["checked"]
        and choice["source"] == str(same)
        and choice["points"] == ["lr0.004-check", "lr0.008-check"]
    )
    report = write_ladder(tmp_path / "out", data, n_boot=200)
    assert report["answer"].endswith("Each interface at its own rate.")
    assert f"of the rate check `{same}`" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(ValueError, match="only to compare each interface at its own rate"):
        ladder_data(dirs, rate=4e-3, rate_checks=[same])
    other = write_rate_check(tmp_path / "check4-8e-3", 4, 30.0, {"learned": 4e-3, "canonical": 8e-3})
    with pytest.raises(
        ValueError, match=re.escape("canonical's own rate 0.008 (its rate check's choice) has 0 finished")
    ):
        ladder_data(dirs, rate="own", rate_checks=[other])
    smaller = write_rate_check(tmp_path / "check4-15", 4, 15.0, {"learned": 4e-3, "canonical": 4e-3})
    with pytest.raises(ValueError, match="checked at its largest budget"):
        ladder_data(dirs, rate="own", rate_checks=[smaller])
    nobody = write_rate_check(tmp_path / "check8", 8, 30.0, {"learned": 4e-3, "canonical": 4e-3})
    with pytest.raises(ValueError, match="must be among"):
        ladder_data(dirs, rate=4e-3, interfaces=["canonical"])
    with pytest.raises(ValueError, match="no rung trained affine"):
        ladder_data(dirs, rate=4e-3, interfaces=["learned", "affine"])
    only = ladder_data(dirs, rate=4e-3, interfaces=["learned"])  # a ladder of the reference alone: no pair
    assert {r["interface"] for rung in only["rungs"] for r in rung["runs"]} == {"learned"}
    one_seed = write_rung(tmp_path / "l4-one-seed", 4, {r: -0.2 for r in RATIOS}, seeds=1)
    with pytest.raises(
        ValueError, match=re.escape("at 7.5 tokens per learned parameter (lr 0.004) learned has 1 seed")
    ):
        ladder_data([dirs[0], one_seed], rate=4e-3)
    with pytest.raises(ValueError, match="matches no rung"):
        ladder_data(dirs, rate="own", rate_checks=[nobody])
    two = write_rate_check(tmp_path / "check2", 2, 30.0, {"learned": 4e-3, "canonical": 4e-3})
    with pytest.raises(ValueError, match="has its own rate check"):
        ladder_data(dirs, rate="own", rate_checks=[two])


def test_ladder_cli_builds_and_rebuilds_from_its_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dirs = [write_rung(tmp_path / f"l{n}", n, {r: -0.2 for r in RATIOS}) for n in (2, 4, 8)]
    assert main(["ladder", *map(str, dirs), "--out", str(tmp_path / "a"), "--bootstrap", "200"]) == 0
    assert "Per doubling of depth" in capsys.readouterr().out
    rebuilt = ["ladder", "--data", str(tmp_path / "a" / "report_data.json"), "--out", str(tmp_path / "b")]
    assert main([*rebuilt, "--bootstrap", "200"]) == 0
    assert (tmp_path / "a" / "report.json").read_text() == (tmp_path / "b" / "report.json").read_text()
    own = ["ladder", *map(str, dirs), "--rate", "own", "--out", str(tmp_path / "own"), "--bootstrap", "200"]
    assert main(own) == 0 and "its only rate" in (tmp_path / "own" / "report.md").read_text()
    capsys.readouterr()
    assert main(["ladder", str(dirs[0]), "--data", "x", "--out", str(tmp_path / "c")]) == 1
    assert "either RUNG_DIR" in capsys.readouterr().err


def _add_band_tallies(directory: Path) -> None:
    """Give every run of a rung frequency-band tallies: each document's tokens spread over five bands in fixed
    proportions, at the document's own loss per token."""
    path = directory / "report_data.json"
    data = json.loads(path.read_text())
    fractions = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    for record in data["runs"]:
        per_document = record["validation"]["per_document"]
        doc_tokens = np.asarray(per_document["tokens"])
        tokens = np.floor(np.outer(doc_tokens, fractions)).astype(int)
        tokens[:, 0] += doc_tokens - tokens.sum(axis=1)
        nats = np.asarray(per_document["nats"])[:, None] * tokens / doc_tokens[:, None]
        table = [
            {"band": b, "types": 2 + b, "train_share": 0.2, "min_per_million": 1.0, "max_per_million": 2.0}
            for b in range(5)
        ]
        side = {"nats": nats.tolist(), "tokens": tokens.tolist()}
        record["validation"]["frequency_bands"] = {
            "scheme": "token-mass quantiles of the training split",
            "bands": 5,
            "train_tokens": 10_000,
            "band_table": table,
            "input": side,
            "target": side,
        }
    path.write_text(json.dumps(data))


def test_ladder_splits_each_rungs_gap_by_frequency_band_where_its_runs_were_tallied(tmp_path: Path):
    dirs = [write_rung(tmp_path / f"l{n}", n, {r: g for r in RATIOS}) for n, g in ((2, -0.3), (4, -0.2))]
    _add_band_tallies(dirs[0])
    report = write_ladder(tmp_path / "ladder", ladder_data(dirs), n_boot=300)
    tallied, untallied = (rung["ratios"][2] for rung in report["rungs"])
    (pair,) = tallied["frequency_bands"]["sides"]["input"]["pairs"]
    assert (pair["a"], pair["b"]) == ("learned", "canonical") and len(pair["bands"]) == 5
    gap = tallied["gaps"]["canonical"]["estimate"]
    assert pair["whole"]["estimate"] == pytest.approx(gap) and pair["sum_of_contributions"] == pytest.approx(
        gap
    )
    assert all(band["estimate"] < -0.25 for band in pair["bands"])  # the planted gap, in every band
    assert "no frequency-band tallies" in untallied["frequency_bands"]["unavailable"]
    markdown = (tmp_path / "ladder" / "report.md").read_text()
    assert "## Where the gap lives in the vocabulary" in markdown
    assert "| 2 layers | 30 | input | learned − canonical |" in markdown
    assert "- 4 layers, 30 tokens/param: 6 of its 6 runs have no frequency-band tallies" in markdown
    data = json.loads((tmp_path / "ladder" / "report_data.json").read_text())
    assert ladder_report(data, n_boot=300) == json.loads((tmp_path / "ladder" / "report.json").read_text())
