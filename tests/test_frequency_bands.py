"""Issue 42.2: the validation gap split by the training-split frequency band of the input and of the target token
(tiny untrained models and synthetic run files: fast)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import tablefree
from tablefree.analysis.frequency_bands import band_split, frequency_bands_markdown, sweep_frequency_bands
from tablefree.checkpoint.model_dir import save_model
from tablefree.cli import main
from tablefree.data.loader import split_shards, token_counts
from tablefree.data.shards import open_shard
from tablefree.data.tokenizer import load_tokenizer, tokenizer_hash
from tablefree.evaluate.frequency_bands import frequency_bands
from tablefree.evaluate.validation import validation_metrics
from tablefree.report import build_report
from tablefree.report.data import DATA_FILE, statistics_from_data
from train_helpers import make_dataset

VOCAB = 96
DOCUMENT_STARTS = [0, 400, 1100, 1500, 2300]


def test_bands_cut_the_training_mass_into_fifths_ties_together_unseen_rarest() -> None:
    counts = np.array([50, 30, 10, 5, 3, 2, 0, 10])
    bands = frequency_bands(counts, 5)
    # mass of strictly more frequent types: 0, 50, 80, 100, 105, 108, 110, 80 of 110, times 5
    assert bands.band_of.tolist() == [0, 2, 3, 4, 4, 4, 4, 3]
    assert frequency_bands(np.full(6, 7), 5).band_of.tolist() == [0] * 6  # equal counts share a band
    rng = np.random.default_rng(0)
    counts = rng.zipf(1.3, size=400).clip(max=10**6)
    band_of = frequency_bands(counts, 5).band_of
    order = np.argsort(-counts, kind="stable")
    assert np.all(np.diff(band_of[order]) >= 0)  # rarer types never sit in a more frequent band
    for band in range(5):  # a band starts where the mass above it crosses its fifth
        above = np.array([counts[counts > c].sum() for c in counts[band_of == band]])
        assert np.all(above >= band * counts.sum() / 5) and (
            band == 4 or np.all(above < (band + 1) * counts.sum() / 5)
        )
    with pytest.raises(ValueError, match="no tokens"):
        frequency_bands(np.zeros(4, dtype=np.int64))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    data = make_dataset(
        tmp_path_factory.mktemp("bands") / "data", VOCAB, train_tokens=8_000, val_tokens=3_000
    )
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["val"]["document_starts"] = DOCUMENT_STARTS
    (data / "manifest.json").write_text(json.dumps(manifest))
    return data


def _model(interface: str, seed: int):
    shape = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_seq_len": 64, "init_std": 0.2}
    config = tablefree.preset("tiny", interface=interface, vocab_size=VOCAB, **shape)
    return tablefree.build_model(config, seed=seed).eval()


def _score(model, data: Path) -> dict:
    tokenizer = load_tokenizer(data / "tokenizer.json")
    return validation_metrics(model, tokenizer, str(data), tokenizer_hash(tokenizer), batch_size=4)


def test_tallies_add_up_to_each_document_and_count_bands_on_the_training_split(dataset: Path) -> None:
    result = _score(_model("canonical", 0), dataset)
    entry = result["frequency_bands"]
    per_document = result["per_document"]
    stream = np.concatenate([open_shard(p) for p in split_shards(dataset, "val")]).astype(np.int64)
    train = token_counts(dataset, VOCAB)
    band_of = frequency_bands(train).band_of
    assert entry["train_tokens"] == int(train.sum()) == 8_000
    for side, ids in (("input", stream[:-1]), ("target", stream[1:])):
        nats, tokens = np.array(entry[side]["nats"]), np.array(entry[side]["tokens"])
        assert nats.shape == (len(DOCUMENT_STARTS), 5)
        np.testing.assert_allclose(nats.sum(axis=1), per_document["nats"], rtol=1e-12)
        assert tokens.sum(axis=1).tolist() == per_document["tokens"]
        assert tokens.sum(axis=0).tolist() == np.bincount(band_of[ids], minlength=5).tolist()
    # the validation split's own frequencies would band differently: the bands are the training split's
    val_bands = frequency_bands(np.bincount(stream, minlength=VOCAB)).band_of
    assert (
        np.bincount(val_bands[stream[1:]], minlength=5).tolist()
        != np.array(entry["target"]["tokens"]).sum(axis=0).tolist()
    )


def test_share_weighted_bands_add_up_to_the_whole_gap(dataset: Path) -> None:
    scored = {
        (interface, seed): _score(_model(interface, 10 * seed + (interface == "learned")), dataset)
        for interface in ("learned", "canonical")
        for seed in (0, 1, 2)
    }
    tallies = {
        i: {s: r["frequency_bands"] for (j, s), r in scored.items() if j == i}
        for i in ("learned", "canonical")
    }
    split = band_split(tallies, [("learned", "canonical")], n_boot=200)
    gap = np.mean(
        [
            scored[("learned", s)]["metrics"]["val_loss"] - scored[("canonical", s)]["metrics"]["val_loss"]
            for s in range(3)
        ]
    )
    for side in ("input", "target"):
        part = split["sides"][side]
        pair = part["pairs"][0]
        assert pair["whole"]["estimate"] == pytest.approx(gap, abs=1e-12)
        assert pair["sum_of_contributions"] == pytest.approx(gap, abs=1e-12)
        assert sum(row["share"] for row in part["bands"]) == pytest.approx(1.0)
        for row, cell in zip(part["bands"], pair["bands"], strict=True):
            loss = {
                i: np.mean(
                    [
                        np.array(t[side]["nats"])[:, row["band"]].sum() / row["tokens"]
                        for t in tallies[i].values()
                    ]
                )
                for i in tallies
            }
            assert row["loss"] == pytest.approx(loss)
            assert cell["estimate"] == pytest.approx(loss["learned"] - loss["canonical"])
            assert cell["low"] < cell["estimate"] < cell["high"]
    markdown = frequency_bands_markdown([{"point": "", **split}])
    assert "## Where the gap lives in the vocabulary" in markdown and "**By input token**" in markdown
    assert "| band 0 |" not in markdown  # one point: no summary across points
    both = frequency_bands_markdown([{"point": "1M", **split}, {"point": "2M", **split}])
    rare = split["sides"]["target"]["pairs"][0]["bands"][-1]
    assert (
        "| 2M | target | learned − canonical | " in both
        and f"{rare['estimate']:.4f} [{rare['low']:.4f}," in both
    )
    # runs scored on other tokens cannot be split together
    other = copy.deepcopy(tallies)
    other["canonical"][2]["target"]["tokens"][0][0] += 1
    with pytest.raises(ValueError, match="different validation tokens"):
        band_split(other, [("learned", "canonical")], n_boot=10)


DOCS, BANDS = 8, 5


def _write_run(root: Path, interface: str, seed: int, rng: np.random.Generator) -> None:
    """Runs whose only difference lies in the rarest input band: canonical loses 0.5 nats there."""
    directory = root / "runs" / f"{interface}-s{seed}"
    directory.mkdir(parents=True)
    validation = _validation(0.5 if interface == "canonical" else 0.0, rng)
    (directory / "eval.json").write_text(json.dumps({"tasks": {"validation": validation}}))
    (directory / "summary.json").write_text(json.dumps({"tokens_seen": 4096, "params": {}}))
    (directory / "status.json").write_text(json.dumps({"state": "done"}))


def _validation(rare_excess: float, rng: np.random.Generator) -> dict:
    """A run's validation results with tallies: 3 nats/token everywhere, ``rare_excess`` more in the rarest input
    band."""
    tokens = np.random.default_rng(99).integers(50, 120, size=(DOCS, BANDS))  # one validation split for all
    per_token = 3.0 + rng.normal(0, 0.02, size=(DOCS, BANDS))
    input_nats = per_token * tokens
    input_nats[:, -1] += rare_excess * tokens[:, -1]
    # the target side: the same tokens and nats per document, spread over the bands otherwise
    target_tokens = np.roll(tokens, 1, axis=1)
    target_nats = (
        input_nats.sum(axis=1, keepdims=True) * target_tokens / target_tokens.sum(axis=1, keepdims=True)
    )
    definition = {
        "scheme": "token-mass quantiles of the training split",
        "bands": BANDS,
        "train_tokens": 10_000,
        "band_table": [
            {"band": b, "types": 3 + b, "train_share": 0.2, "min_per_million": 1.0, "max_per_million": 2.0}
            for b in range(BANDS)
        ],
    }
    val_loss = float(input_nats.sum() / tokens.sum())
    validation = {
        "metrics": {"val_loss": val_loss, "val_ppl": math.exp(val_loss), "bits_per_byte": val_loss / 3},
        "tokens": int(tokens.sum()),
        "bytes": int(tokens.sum()) * 4,
        "n": 4,
        "per_document": {
            "documents": DOCS,
            "nats": input_nats.sum(axis=1).tolist(),
            "tokens": tokens.sum(axis=1).tolist(),
        },
        "frequency_bands": {
            **definition,
            "input": {"nats": input_nats.tolist(), "tokens": tokens.tolist()},
            "target": {"nats": target_nats.tolist(), "tokens": target_tokens.tolist()},
        },
    }
    return validation


def test_bands_at_each_interface_own_best_rate_pair_runs_of_two_grid_points(tmp_path: Path) -> None:
    # canonical loses 0.5 nats on the rarest input band at 4e-3 and 0.2 at 8e-3; learned ran at 4e-3 only
    excess = {("learned", "lr4e-3"): 0.0, ("canonical", "lr4e-3"): 0.5, ("canonical", "lr8e-3"): 0.2}
    runs = [
        SimpleNamespace(
            name=f"{point}/{interface}-s{seed}",
            interface=interface,
            seed=seed,
            point=point,
            eval={"tasks": {"validation": _validation(extra, np.random.default_rng(10 * seed + arm))}},
        )
        for seed in range(3)
        for arm, ((interface, point), extra) in enumerate(excess.items())
    ]
    pairs = [("learned", "canonical")]
    own = {"learned": "lr4e-3", "canonical": "lr8e-3"}
    sections = sweep_frequency_bands(runs, ["lr4e-3", "lr8e-3"], pairs, 200, [own, {"learned": "lr4e-3"}])
    assert [s["point"] for s in sections] == [
        "lr4e-3",
        "lr8e-3",
        "own best rates (learned lr4e-3, canonical lr8e-3)",
    ]  # one interface's own point alone, or both at one point, adds nothing
    at_point, at_own = sections[0]["sides"]["input"]["pairs"][0], sections[2]["sides"]["input"]["pairs"][0]
    assert sections[2]["own_points"] == own and sections[1]["sides"]["input"]["pairs"] == []
    assert at_point["bands"][-1]["estimate"] == pytest.approx(-0.5, abs=0.05)
    assert at_own["bands"][-1]["estimate"] == pytest.approx(-0.2, abs=0.05) and at_own["seeds"] == [0, 1, 2]
    assert at_own["sum_of_contributions"] == pytest.approx(at_own["whole"]["estimate"], abs=1e-12)
    markdown = frequency_bands_markdown(sections)
    assert "**By input token at own best rates (learned lr4e-3, canonical lr8e-3)**" in markdown
    # rebuilt from a report_data.json alone, whose own_rate_points carry the rate check's choice
    records = [
        {
            "name": run.name,
            "point": run.point,
            "interface": run.interface,
            "seed": run.seed,
            "state": "done",
            "tokens_seen": 4096,
            "params": {},
            "validation": run.eval["tasks"]["validation"],
            "curve": [],
        }
        for run in runs
    ]
    data = {
        "format": "tablefree-report-data/1",
        "baselines": [],
        "grid_points": ["lr4e-3", "lr8e-3"],
        "runs": records,
        "own_rate_points": [own],
    }
    (tmp_path / DATA_FILE).write_text(json.dumps(data))
    rebuilt = statistics_from_data(tmp_path / DATA_FILE, n_boot=200)["frequency_bands"]
    assert json.loads(json.dumps(rebuilt)) == json.loads(json.dumps(sections))
    del data["own_rate_points"]  # data written before the choices were kept: the grid points' splits only
    (tmp_path / DATA_FILE).write_text(json.dumps(data))
    assert len(statistics_from_data(tmp_path / DATA_FILE, n_boot=200)["frequency_bands"]) == 2


@pytest.mark.slow
def test_compare_report_finds_the_planted_band_and_ships_the_split(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "compare.yaml").write_text(
        yaml.safe_dump({"name": "bands", "interfaces": ["learned", "canonical"]})
    )
    for seed in range(3):
        for interface in ("learned", "canonical"):
            _write_run(sweep, interface, seed, np.random.default_rng(10 * seed + len(interface)))
    report = build_report(sweep, n_boot=300)
    section = report["frequency_bands"][0]
    comparison = report["statistics"]["comparisons"][0]
    pair = section["sides"]["input"]["pairs"][0]
    assert (pair["a"], pair["b"]) == ("learned", "canonical")
    assert pair["whole"]["estimate"] == pytest.approx(comparison["estimate"], abs=1e-12)
    assert pair["sum_of_contributions"] == pytest.approx(comparison["estimate"], abs=1e-12)
    rare = pair["bands"][-1]
    assert rare["estimate"] == pytest.approx(-0.5, abs=0.05) and rare["high"] < 0
    assert all(abs(row["estimate"]) < 0.05 for row in pair["bands"][:-1])
    assert rare["contribution"] == pytest.approx(comparison["estimate"], rel=0.1)
    assert json.loads((sweep / DATA_FILE).read_text())["frequency_bands"] == json.loads(
        json.dumps(section and report["frequency_bands"])
    )
    rebuilt = statistics_from_data(sweep / DATA_FILE, n_boot=300)["frequency_bands"]  # the shipped file alone
    assert json.loads(json.dumps(rebuilt)) == json.loads(json.dumps(report["frequency_bands"]))
    markdown = (sweep / "report.md").read_text()
    assert "## Where the gap lives in the vocabulary" in markdown and "**By target token**" in markdown
    # a run evaluated before the tallies existed: the section says why there is no split
    for seed in range(3):
        path = sweep / "runs" / f"canonical-s{seed}" / "eval.json"
        results = json.loads(path.read_text())
        del results["tasks"]["validation"]["frequency_bands"]
        path.write_text(json.dumps(results))
    report = build_report(sweep, n_boot=50)
    assert "no frequency-band tallies" in report["frequency_bands"][0]["unavailable"]
    assert "No band split: 3 run(s) have no frequency-band tallies" in (sweep / "report.md").read_text()


@pytest.mark.slow
def test_analyze_frequency_bands_scores_a_checkpoint_against_its_reference(dataset: Path, tmp_path, capsys):
    def save(name: str, model) -> Path:
        tokenizer = dataset / "tokenizer.json"
        meta = {"step": 0, "seed": 0, "tokenizer_hash": tokenizer_hash(tokenizer), "data_dir": str(dataset)}
        return save_model(tmp_path / name, model, meta=meta, tokenizer_path=tokenizer)

    canonical, learned = save("canonical", _model("canonical", 0)), save("learned", _model("learned", 0))
    assert main(["analyze", str(canonical), "--frequency-bands", "--out", str(tmp_path / "o")]) == 1
    assert (
        "--frequency-bands compares two models: name the other one with --reference"
        in capsys.readouterr().err
    )
    assert main(["analyze", str(canonical), "--reference", str(learned), "--frequency-bands"]) == 0
    out = canonical / "frequency-bands"  # not the probes' directory, which is replaced whole
    result = json.loads((out / "frequency_bands.json").read_text())
    pair = result["sides"]["target"]["pairs"][0]
    gap = (
        _score(_model("canonical", 0), dataset)["metrics"]["val_loss"]
        - _score(_model("learned", 0), dataset)["metrics"]["val_loss"]
    )
    assert (pair["a"], pair["b"]) == ("canonical", "learned") and pair["whole"]["estimate"] == pytest.approx(
        gap
    )
    assert pair["whole"]["low"] is not None  # one seed: the document bootstrap's interval
    assert "# Where the gap lives in the vocabulary" in (out / "frequency_bands.md").read_text()


def test_a_run_evaluated_before_the_tallies_is_evaluated_again(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tablefree.sweep.config import EvalSection
    from tablefree.sweep.status import run_state

    run = SimpleNamespace(directory=tmp_path, select_every=0)
    (tmp_path / "summary.json").write_text(json.dumps({"completed": True}))
    (tmp_path / "eval_examples.jsonl").write_text("")
    validation = {"per_document": {}, "coverage": {}}
    results = {"tasks": {"validation": validation}, "limit": None, "val_limit": None}
    (tmp_path / "eval.json").write_text(json.dumps(results))
    assert run_state(run, EvalSection()) == "trained"
    validation["frequency_bands"] = None  # scored on a dataset without a train split: nothing to redo
    (tmp_path / "eval.json").write_text(json.dumps(results))
    assert run_state(run, EvalSection()) == "done"
