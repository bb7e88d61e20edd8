"""The interface-comparison sweep end to end at toy scale: report files, a failed run, an interrupted sweep."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from tablefree.compare import CompareConfig, load_compare_config, run_sweep
from tablefree.config_parsing import from_dict
from tablefree.sweep.grid import run_recipe
from tablefree.train import trainer

RECIPE = {
    "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
    "budget": "8 steps",
    "batch_tokens": 512,
    "micro_batch": 8,
    "seq_len": 64,
    "optim": {"lr": 2e-3},
    "schedule": {"name": "cosine", "warmup_steps": 2},
    "log_every": 2,
    "val_every": 4,
    "val_batches": 2,
    "checkpoint_every": 4,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE dataset from the language reference that ships with Python."""
    from pydoc_data.topics import topics

    from tablefree.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("data")
    corpus = root / "topics.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": topics[k]}) + "\n" for k in sorted(topics)), encoding="utf-8"
    )
    prepare_dataset(corpus, root / "topics-512", vocab_size=512, val_fraction=0.1, workers=1, progress=False)
    return root / "topics-512"


def sweep_config(dataset: Path, out: Path, shared_eval: Path | None) -> CompareConfig:
    tasks = ["validation", "piqa"] if shared_eval else ["validation"]
    data = {
        "name": "toy",
        "train": RECIPE,
        "dataset": {"dir": str(dataset)},
        "interfaces": ["learned", "canonical"],
        "seeds": [0, 1],
        "eval": {"tasks": tasks, "limit": 24, "data_dir": str(shared_eval) if shared_eval else None},
        "out": str(out),
        "bootstrap": 200,
    }
    return from_dict(CompareConfig, data)


def shared_eval_dir() -> Path | None:
    """The shared benchmark files when present (they are in CI); the sweep then also scores PIQA."""
    directory = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval"
    return directory if (directory / "piqa" / "valid.jsonl").exists() else None


def test_run_recipe_changes_only_interface_and_seed() -> None:
    base = {
        "model": {"preset": "tiny", "interface": {"name": "learned", "lift": "interleave"}},
        "seed": 0,
        "x": 1,
    }
    run = run_recipe(base, "affine", 3)
    assert run == {
        "model": {"preset": "tiny", "interface": {"name": "affine", "lift": "interleave"}},
        "seed": 3,
        "x": 1,
    }
    assert base["model"]["interface"]["name"] == "learned"  # the base recipe is not modified


@pytest.mark.slow
def test_sweep_reports_survives_a_failure_and_resumes(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sweep"
    config = sweep_config(dataset, out, shared_eval_dir())
    real_train = trainer.train
    calls: list[str] = []

    def failing_train(train_config, run_dir, resume=False):
        calls.append(Path(run_dir).name)
        if Path(run_dir).name == "learned-s1":
            raise RuntimeError("injected failure")
        return real_train(train_config, run_dir, resume=resume)

    # 1. One run fails; the other three finish and the report names the failure.
    monkeypatch.setattr(trainer, "train", failing_train)
    result = run_sweep(config, log=lambda _: None)
    assert result["failed"] == ["learned-s1"]
    assert [name for name, state in result["runs"].items() if state == "done"] == [
        "learned-s0",
        "canonical-s0",
        "canonical-s1",
    ]
    assert "injected failure" in (out / "runs" / "learned-s1" / "error.txt").read_text()
    assert "learned-s1 failed" in (out / "report.md").read_text()

    # 2. The retry of the failed run is interrupted (SIGINT) midway: the trainer checkpoints and the sweep stops.
    real_lr_at = trainer.lr_at

    def interrupting_lr_at(step, *args):
        if step == 5:
            signal.raise_signal(signal.SIGINT)
        return real_lr_at(step, *args)

    monkeypatch.setattr(trainer, "train", real_train)
    monkeypatch.setattr(trainer, "lr_at", interrupting_lr_at)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, log=lambda _: None)
    interrupted = out / "runs" / "learned-s1"
    assert not json.loads((interrupted / "summary.json").read_text())["completed"]
    assert (interrupted / "checkpoints" / "step_00000005" / "COMPLETE").exists()

    # 3. Re-running trains only the interrupted run, resuming it; finished runs are not touched.
    monkeypatch.setattr(trainer, "lr_at", real_lr_at)
    finished = ["learned-s0", "canonical-s0", "canonical-s1"]
    stamps = {
        name: [(out / "runs" / name / f).stat().st_mtime_ns for f in ("summary.json", "eval.json")]
        for name in finished
    }
    calls.clear()
    resumed_from: list[str] = []

    def counting_train(train_config, run_dir, resume=False):
        calls.append(Path(run_dir).name)
        resumed_from.append(sorted((Path(run_dir) / "checkpoints").glob("step_*"))[-1].name)
        return real_train(train_config, run_dir, resume=resume)

    monkeypatch.setattr(trainer, "train", counting_train)
    result = run_sweep(config, log=lambda _: None)
    assert calls == ["learned-s1"] and resumed_from == ["step_00000005"]
    assert result["failed"] == [] and set(result["runs"].values()) == {"done"}
    for name in finished:
        now = [(out / "runs" / name / f).stat().st_mtime_ns for f in ("summary.json", "eval.json")]
        assert now == stamps[name], f"{name} was redone"
    steps = [json.loads(line)["step"] for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 8

    # The report: JSON parses, figures are real images, the markdown covers every interface and metric.
    report = json.loads((out / "report.json").read_text())
    assert report["interfaces"] == ["learned", "canonical"]
    assert {run["state"] for run in report["runs"]} == {"done"}
    assert "validation/val_loss" in report["metrics"]
    comparisons = report["statistics"]["comparisons"]
    # one test per question: validation loss (not perplexity or bits per byte) and each benchmark's headline
    assert {c["metric"] for c in comparisons} <= {"validation/val_loss", "piqa/acc"}
    # two seeds: intervals, but no verdict (one degree of freedom for the seed variation)
    assert all(c["sentence"].startswith(("not resolved with 2 seeds", "at chance")) for c in comparisons)
    assert all("scale:" not in c["sentence"] for c in comparisons)
    validation = next(c for c in comparisons if c["metric"] == "validation/val_loss")
    # paired by seed, with the cluster bootstrap over the validation documents
    assert (
        validation["seeds"] == 2
        and validation["clusters"] > 1
        and "cluster bootstrap" in validation["method"]
    )
    if shared_eval_dir():
        piqa = next(c for c in comparisons if c["metric"] == "piqa/acc")
        assert piqa["clusters"] == 24 and piqa["chance"]["chance_level"] == 0.5
    assert set(report["points"][0]["cv_val_ppl"]) == {"learned", "canonical"}
    assert report["baseline"]["val_loss"] > 0
    gap = report["statistics"]["gap"][0]
    assert (gap["a"], gap["b"], gap["seeds"]) == ("learned", "canonical", 2)
    assert [p["tokens"] for p in gap["curve"]] == [2048.0, 4096.0]  # val_every 4 steps of 512 tokens
    markdown = (out / "report.md").read_text()
    for word in (
        "learned",
        "canonical",
        "## Statistics",
        "## Parameters",
        "## Baseline",
        "git commit",
        "torch",
    ):
        assert word in markdown
    assert len(report["figures"]) == 4
    for figure in report["figures"]:
        path = out / figure["path"]
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width, _ = matplotlib.image.imread(path).shape
        assert height > 150 and width > 400


def test_load_compare_config_applies_command_line_choices(tmp_path: Path) -> None:
    path = tmp_path / "compare-x.yaml"
    path.write_text("train: {data: {dir: somewhere}}\ninterfaces: [learned]\nseeds: [0]\n")
    config = load_compare_config(path, interfaces=["canonical", "affine"], seeds=[4, 5], out=tmp_path / "o")
    assert (config.name, config.interfaces, config.seeds) == ("compare-x", ["canonical", "affine"], [4, 5])
    assert config.out_dir == tmp_path / "o"
    path.write_text("interfaces: [learned, tabular]\n")
    with pytest.raises(ValueError, match="tabular"):
        load_compare_config(path)


def test_baselines_limit_the_compared_pairs_and_holms_family(tmp_path: Path) -> None:
    from tablefree.report.comparison import comparisons, gap_curves
    from tablefree.rundir import Run

    names = ["learned", "canonical", "affine", "hashed"]
    runs = []
    for rank, interface in enumerate(names):
        for seed in range(3):
            directory = tmp_path / f"{interface}-s{seed}"
            directory.mkdir()
            estimates = [6.0 - 0.1 * step + 0.1 * rank + 0.01 * seed for step in range(1, 5)]
            (directory / "metrics.jsonl").write_text(
                "".join(
                    json.dumps({"step": i, "tokens": 100 * i, "val_loss": v}) + "\n"
                    for i, v in enumerate(estimates)
                )
            )
            loss = 5.0 + 0.1 * rank + 0.02 * seed + 0.003 * (seed * rank % 3)
            evaluation = {"tasks": {"validation": {"metrics": {"val_loss": loss}}}}
            summary = {"completed": True, "tokens_seen": 400}
            runs.append(
                Run(interface, seed, directory, status={"state": "done"}, summary=summary, eval=evaluation)
            )

    every = comparisons(runs, names, n_boot=200)
    assert len(every) == 6 and {c["family"] for c in every} == {6}
    controlled = comparisons(runs, names, n_boot=200, baselines=["learned", "canonical"])
    assert [(c["a"], c["b"]) for c in controlled] == [
        ("learned", "canonical"), ("learned", "affine"), ("learned", "hashed"),
        ("canonical", "affine"), ("canonical", "hashed"),
    ]  # fmt: skip
    assert {c["family"] for c in controlled} == {5}
    resolved = [c for c in controlled if c["verdict"] == "resolved"]
    assert resolved and all("over 5 pairs" in c["sentence"] for c in resolved)
    curves = gap_curves(runs, names, baselines=["hashed"])
    assert [(g["a"], g["b"]) for g in curves] == [
        ("learned", "hashed"),
        ("canonical", "hashed"),
        ("affine", "hashed"),
    ]
    # a sweep grows by interfaces: a baseline need not be among this invocation's interfaces
    assert CompareConfig(interfaces=["gaussian"], baselines=["learned"]).baselines == ["learned"]
    with pytest.raises(ValueError, match="baselines: expected distinct names"):
        CompareConfig(baselines=["learned", "learned"])
    with pytest.raises(ValueError, match="baselines: expected distinct names"):
        CompareConfig(baselines=["tabular"])


@pytest.mark.parametrize(
    "name",
    [
        "study-cpu",
        "study-cpu-size",
        "study-cpu-ablation",
        "study-cpu-projected-lift",
        "compare-tiny",
        "compare-small",
    ],
)
def test_shipped_compare_configs_plan_every_run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tablefree.sweep.config import base_recipe
    from tablefree.sweep.plan import plan_runs
    from tablefree.train.recipe import TrainConfig

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the configs name their recipe and dataset relative to a checkout
    config = load_compare_config(repo / "configs" / f"{name}.yaml")
    plans = plan_runs(config)
    assert len(plans) == len(config.interfaces) * len(config.seeds) * max(1, len(config.grid.points()))
    study = load_compare_config(repo / "configs" / "study-cpu.yaml")
    if name == "study-cpu-ablation":  # docs/analysis.md reuses the main study's runs: the recipes must agree
        assert base_recipe(config) == base_recipe(study)
        assert set(study.interfaces) <= set(config.interfaces) and set(config.seeds) <= set(study.seeds)
    if name == "study-cpu-projected-lift":  # the study's recipe plus an option that only `projected` reads
        recipe = base_recipe(config)
        assert recipe["model"]["interface"].pop("init") == "lift"
        assert recipe == base_recipe(study)
        study_plans = {p.name: p for p in plan_runs(study)}
        copied = [plan for plan in plans if plan.interface != "projected"]  # the study's model and training
        for plan in copied:
            ours, theirs = (from_dict(TrainConfig, r.recipe) for r in (plan, study_plans[plan.name]))
            assert ours == theirs and ours.model.build(4096) == theirs.model.build(4096)


def test_sweep_refuses_to_mix_recipes(dataset: Path, tmp_path: Path) -> None:
    from tablefree.sweep.record import write_sweep_config

    config = sweep_config(dataset, tmp_path, None)
    write_sweep_config(config, tmp_path)
    changed = sweep_config(dataset, tmp_path, None)
    changed.train = {**RECIPE, "budget": "16 steps"}
    with pytest.raises(ValueError, match="different training recipe"):
        write_sweep_config(changed, tmp_path)


def test_read_jsonl_drops_only_a_torn_last_line(tmp_path: Path) -> None:
    from tablefree.rundir import read_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: malformed JSON line"):
        read_jsonl(path)


def test_the_whole_sweep_is_checked_before_anything_trains(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[str] = []
    monkeypatch.setattr(trainer, "train", lambda config, run_dir, resume=False: trained.append(run_dir))
    config = sweep_config(dataset, tmp_path / "bad-option", None)
    config.interfaces = ["learned", "canonical"]
    config.train = {**RECIPE, "model": {**RECIPE["model"], "interface": {"lift": "sideways"}}}
    with pytest.raises(ValueError, match=r"recipe of (learned|canonical)-s0\b.*lift"):
        run_sweep(config, log=lambda _: None)
    assert trained == [] and not (tmp_path / "bad-option" / "runs").exists()
    data = {"train": RECIPE, "dataset": {"dir": str(dataset)}, "eval": {"limit": 0}}
    with pytest.raises(ValueError, match=r"eval\.limit: expected a positive number"):
        from_dict(CompareConfig, data)
    # every missing benchmark file at once (issue 25), with compare's own option, not eval's --eval-data
    data["eval"] = {"tasks": ["validation", "hellaswag", "piqa"], "data_dir": str(tmp_path / "nowhere")}
    with pytest.raises(FileNotFoundError, match=r"eval\.data_dir=DIR") as caught:
        run_sweep(from_dict(CompareConfig, {**data, "out": str(tmp_path / "o")}), log=lambda _: None)
    message = str(caught.value)
    assert "hellaswag: " in message and "piqa: " in message and "--eval-data" not in message
    assert trained == []


def test_grid_plans_every_point(dataset: Path, tmp_path: Path) -> None:
    from tablefree.sweep.plan import plan_runs

    config = sweep_config(dataset, tmp_path, None)
    config.grid = from_dict(
        CompareConfig,
        {"grid": {"budget": ["4 steps", "8 steps"], "model": [{"d_model": 32}, {"d_model": 64}]}},
    ).grid
    plans = plan_runs(config)
    points = list(dict.fromkeys(plan.point for plan in plans))
    assert points == ["d32-4steps", "d32-8steps", "d64-4steps", "d64-8steps"]
    assert len(plans) == 4 * 2 * 2
    # seeds outer, interfaces inner: a sweep stopped early holds complete seed-paired sets
    assert [(p.seed, p.interface) for p in plans[:4]] == [
        (seed, interface) for seed in config.seeds for interface in config.interfaces
    ][:4]
    first = plans[0]
    assert first.directory == tmp_path / "runs" / "d32-4steps" / "learned-s0"
    assert (first.recipe["budget"], first.recipe["model"]["d_model"], first.recipe["model"]["n_layers"]) == (
        "4 steps",
        32,
        1,
    )


@pytest.mark.slow
def test_grid_sweep_reports_the_gap_at_each_point(dataset: Path, tmp_path: Path) -> None:
    config = sweep_config(dataset, tmp_path / "grid", None)
    config.grid = from_dict(CompareConfig, {"grid": {"budget": ["4 steps", "8 steps"]}}).grid
    result = run_sweep(config, log=lambda _: None)
    assert set(result["runs"].values()) == {"done"} and len(result["runs"]) == 8
    report = result["report"]
    assert [row["point"] for row in report["statistics"]["grid"]] == ["4steps", "8steps"]
    tokens = [row["interfaces"]["learned"]["tokens"] for row in report["statistics"]["grid"]]
    assert tokens == [2048.0, 4096.0]
    assert {c["point"] for c in report["statistics"]["comparisons"]} == {"4steps", "8steps"}
    assert any(figure["path"] == "figures/scaling.png" for figure in report["figures"])
    assert "## Grid" in (tmp_path / "grid" / "report.md").read_text()
    # the report is rebuilt from the files alone, grid points included
    from tablefree.report import build_report

    rebuilt = build_report(tmp_path / "grid", n_boot=200)
    assert [c["sentence"] for c in rebuilt["statistics"]["comparisons"]] == [
        c["sentence"] for c in report["statistics"]["comparisons"]
    ]


def test_per_document_validation_losses_add_up(dataset: Path, tmp_path: Path) -> None:
    from tablefree.data.loader import document_bounds
    from tablefree.evaluate.validation import DocumentTally

    tally = DocumentTally(str(dataset))
    nats = np.arange(3 * 64, dtype=np.float64)
    tally.add(1, nats[:128])
    tally.add(129, nats[128:])
    out = tally.as_dict()
    assert sum(out["tokens"]) == 3 * 64 and sum(out["nats"]) == pytest.approx(nats.sum())
    bounds = document_bounds(str(dataset), "val")
    # target token p (p = 1 … 192) lies in document j when bounds[j] <= p < bounds[j + 1]
    expected = np.bincount(
        np.searchsorted(bounds, np.arange(1, 193), side="right") - 1, minlength=len(bounds) - 1
    )
    assert out["tokens"] == expected.tolist()


def _comparison(metric: str, estimate: float, low: float | None, high: float | None, verdict: str) -> dict:
    return {
        "point": "",
        "metric": metric,
        "a": "learned",
        "b": "canonical",
        "higher_is_better": metric != "validation/val_loss",
        "estimate": estimate,
        "low": low,
        "high": high,
        "verdict": verdict,
    }


def test_differences_figure_draws_ties_at_true_scale() -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from tablefree.report.figures import _differences

    report = {
        "metrics": {},
        "statistics": {
            "comparisons": [
                _comparison(
                    "piqa/acc", -2e-17, -5e-17, 0.0, "at chance"
                ),  # floating-point noise around a tie
                _comparison("validation/val_loss", 0.3, 0.2, 0.4, "resolved"),
            ]
        },
    }
    figure = _differences([], report, {"learned": "b", "canonical": "o"})
    piqa, validation = figure.axes[:2]
    figure.canvas.draw()
    assert piqa.get_xaxis().get_offset_text().get_text() == ""  # no "1e−17" offset label
    assert piqa.get_xlim() == pytest.approx((-1.15, 1.15))  # an all-tie axis, not a magnified −5…0 bar
    assert any("tie" in text.get_text() for text in piqa.texts)
    assert validation.get_xlim() == pytest.approx((-0.46, 0.46))


def test_one_seed_results_show_no_spread() -> None:
    from tablefree.report.markdown import _metrics

    cell = {"mean": 6.1, "std": None, "n": 1, "values": {0: 6.1}}
    report = {
        "interfaces": ["learned"],
        "points": [
            {
                "name": "",
                "metrics": {
                    "validation/val_loss": {"higher_is_better": False, "per_interface": {"learned": cell}}
                },
            }
        ],
    }
    text = _metrics(report)
    assert "| validation/val_loss ↓ | 6.1 [s0: 6.1] |" in text and "±" not in text.split("\n", 3)[3]


def test_human_token_counts() -> None:
    from tablefree.units import human

    assert [human(v) for v in (470_016, 2_500_000, 163_840, 24_576, 1_000_000, 512)] == [
        "470k",
        "2.5M",
        "164k",
        "24.6k",
        "1M",
        "512",
    ]
    # the trainer's console lines: fixed decimals
    assert [human(v, 2) for v in (4096, 40_960, 1.5e12, 512)] == ["4.10k", "40.96k", "1.50T", "512"]


def _compare_yaml(tmp_path: Path, dataset_dir: str, corpus: str) -> Path:
    """A compare config as shipped: its own dataset directory and the corpus to prepare into it."""
    import yaml

    path = tmp_path / "compare-mine.yaml"
    data = {
        "train": RECIPE,
        "dataset": {"dir": dataset_dir, "corpus": corpus, "vocab_size": 512},
        "interfaces": ["learned", "canonical"],
        "seeds": [0],
        "eval": {"tasks": ["validation"]},
        "out": str(tmp_path / "sweep"),
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_dataset_dir_named_on_the_command_line_must_exist(dataset: Path, tmp_path: Path) -> None:
    """issue 25.1: a typo in dataset.dir made the config's own corpus fill the misspelt directory."""
    from tablefree.sweep.dataset import prepare_data

    corpus = dataset.parent / "topics.jsonl"
    path = _compare_yaml(tmp_path, str(tmp_path / "shipped"), str(corpus))
    typo = tmp_path / "westrn2"
    config = load_compare_config(path, overrides=[f"dataset.dir={typo}"])
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json.*tablefree data prepare CORPUS --out"):
        prepare_data(config, log=lambda line: None)
    assert not typo.exists()
    # naming the corpus in the same command prepares it there
    named = load_compare_config(path, overrides=[f"dataset.dir={typo}", f"dataset.corpus={corpus}"])
    assert named.dataset.corpus == str(corpus)


def test_a_prepared_dataset_must_be_the_configs_corpus(dataset: Path, tmp_path: Path) -> None:
    """A corpus named over a directory that holds another prepared corpus is refused, not silently ignored."""
    from tablefree.sweep.dataset import prepare_data

    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "some other text"}\n')
    config = load_compare_config(_compare_yaml(tmp_path, str(dataset), str(other)))
    with pytest.raises(ValueError, match=r"was prepared from .*topics\.jsonl, not dataset\.corpus"):
        prepare_data(config, log=lambda line: None)


def test_provenance_and_title_come_from_the_dataset_used(dataset: Path, tmp_path: Path) -> None:
    """issue 25.2: a sweep on the user's own data recorded the shipped config's corpus and was titled after it."""
    from tablefree.config_parsing import load_yaml
    from tablefree.data.loader import read_manifest
    from tablefree.report.markdown import _config_and_data
    from tablefree.sweep.dataset import prepare_data
    from tablefree.sweep.record import write_sweep_config

    path = _compare_yaml(tmp_path, "data/shipped-4k", "../shared/data/corpus/gutenberg-mix")
    config = load_compare_config(path, overrides=[f"dataset.dir={dataset}"])
    prepare_data(config, log=lambda line: None)
    config.out_dir.mkdir(parents=True)
    write_sweep_config(config, config.out_dir)
    recorded = load_yaml(config.out_dir / "compare.yaml")
    assert "gutenberg" not in json.dumps(recorded)
    manifest = read_manifest(dataset)
    used = recorded["dataset"]
    assert used["dir"] == str(dataset) and used["tokenizer_hash"] == manifest["tokenizer_hash"]
    assert [Path(p).resolve() for p in used["corpus"]] == [(dataset.parent / "topics.jsonl").resolve()]
    assert used["sources"][0]["sha256"] == manifest["sources"][0]["sha256"]
    assert used["splits"]["val"]["sha256"] == {
        s["file"]: s["sha256"] for s in manifest["splits"]["val"]["shards"]
    }
    title = _config_and_data({"name": "compare-mine", "config": recorded})
    assert f"config `{path}`" in title and f"dataset `{dataset}`" in title and "`topics.jsonl`" in title
    assert manifest["tokenizer_hash"][:12] in title


def test_a_limited_validation_is_reported_and_the_baseline_scores_the_same_tokens(
    dataset: Path, tmp_path: Path
) -> None:
    """issue 25.3: eval.val_limit cut the split without a word, and the unigram baseline beside it was measured
    on the whole split."""
    config = sweep_config(dataset, tmp_path / "sweep", None)
    config.seeds, config.eval.val_limit = [0], 2
    logged: list[str] = []
    run_sweep(config, log=logged.append)
    # the sweep's ETA: the other interface has the same model size, so its time is known from the first run
    assert any(line.startswith("sweep: 1 run(s) to go; about ") for line in logged)
    report = json.loads((tmp_path / "sweep" / "report.json").read_text())
    scored = json.loads((tmp_path / "sweep" / "runs" / "learned-s0" / "eval.json").read_text())
    validation = scored["tasks"]["validation"]
    assert validation["n"] == 2 and validation["coverage"]["left_out_by"] == "limit=2 windows"
    assert report["baseline"]["val_tokens"] == validation["tokens"] < validation["coverage"]["target_tokens"]
    assert report["baseline"]["scored_targets"] == validation["coverage"]["scored_targets"]
    markdown = (tmp_path / "sweep" / "report.md").read_text()
    assert "**Not the whole validation split.** validation (limit=2 windows): scored" in markdown
    assert "validation tokens the runs were scored on" in markdown


def test_a_dataset_named_on_the_command_line_drops_the_configs_preparation_settings(
    dataset: Path, tmp_path: Path
) -> None:
    """The shipped config's vocab_size describes its own dataset, not the one the user names."""
    from tablefree.sweep.dataset import prepare_data

    path = _compare_yaml(tmp_path, "data/shipped-4k", "../shared/data/corpus/gutenberg-mix")
    config = load_compare_config(path, overrides=[f"dataset.dir={dataset}"])
    assert config.dataset.corpus is None and config.dataset.vocab_size is None
    prepare_data(config, log=lambda line: None)  # the 512-token dataset is used as it is
    named = load_compare_config(path, overrides=[f"dataset.dir={dataset}", "dataset.vocab_size=4096"])
    with pytest.raises(ValueError, match=r"has a vocabulary of 512, dataset\.vocab_size says 4096"):
        prepare_data(named, log=lambda line: None)


def test_the_time_left_follows_the_tokens_and_says_when_it_is_unknown(dataset: Path, tmp_path: Path) -> None:
    """issue 35: the first ETA of a budget grid said 32 min for 13, one average run's time per run left."""
    from tablefree.sweep.local import time_left, tokens_to_train
    from tablefree.sweep.plan import plan_runs

    config = sweep_config(dataset, tmp_path, None)
    config.grid = from_dict(
        CompareConfig,
        {"grid": {"budget": ["4 steps", "16 steps"], "model": [{"d_model": 32}, {"d_model": 64}]}},
    ).grid
    plans = plan_runs(config)
    small = [p for p in plans if p.point.startswith("d32")]
    short, long = small[0], next(p for p in small if p.point.endswith("16steps"))
    assert tokens_to_train(long) == 4 * tokens_to_train(short)
    # 10 s for the 4-step run: a 16-step run of the same size takes 40 s, not 10
    from tablefree.sweep.local import _model_key

    measured = {_model_key(short): [float(tokens_to_train(short)), 10.0]}
    assert time_left([long], measured) == "about 40 s more at the token rate of the runs finished so far"
    assert time_left([long, short], measured).startswith("about 50 s more")
    # a model size not measured yet: no number is made up
    other = next(p for p in plans if p.point.startswith("d64"))
    assert (
        time_left([long, other], measured)
        == "time left unknown until a run of each model size has finished here"
    )
