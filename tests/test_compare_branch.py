"""Budget branching, the learning-rate grid and the selection split of `compare` (docs/experiments.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sweep_helpers import BRANCH_RECIPE as RECIPE
from sweep_helpers import topics_dataset
from tablefree.compare import CompareConfig, run_sweep
from tablefree.config_parsing import from_dict, to_dict
from tablefree.data.loader import TokenLoader
from tablefree.report.data import DATA_FILE, statistics_from_data
from tablefree.sweep.grid import rate_name
from tablefree.sweep.plan import plan_runs
from tablefree.train.recipe import TrainConfig, decay_start, lr_at
from train_helpers import make_dataset, micro_config


def branched(tmp_path: Path, data: Path, **grid) -> CompareConfig:
    return from_dict(
        CompareConfig,
        {
            "name": "branch",
            "train": RECIPE,
            "dataset": {"dir": str(data)},
            "interfaces": ["learned", "canonical"],
            "seeds": [0, 1],
            "grid": {"budget": ["8 steps", "16 steps", "32 steps"], "branch": True, **grid},
            "out": str(tmp_path / "sweep"),
            "bootstrap": 200,
        },
    )


def test_branching_plans_one_trunk_per_interface_and_seed(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    plans = plan_runs(branched(tmp_path, data))
    assert len(plans) == 3 * 2 * 2
    # trunk first, then its branches, shortest first; seeds outer, interfaces inner
    assert [p.name for p in plans[:3]] == ["32steps/learned-s0", "8steps/learned-s0", "16steps/learned-s0"]
    trunk, short, middle = plans[:3]
    assert trunk.branch is None and trunk.recipe["checkpoint_steps"] == [6, 12]
    assert (short.branch.trunk, short.branch.step, short.branch.directory) == (trunk.name, 6, trunk.directory)
    assert middle.branch.step == 12 and middle.train_config.checkpoint_steps == []
    # each branch point is the branch's own decay start, and the two schedules agree up to it
    schedule = trunk.train_config.schedule
    for run, steps in ((short, 8), (middle, 16)):
        assert run.branch.step == decay_start(steps, schedule)
        assert all(
            lr_at(s, steps, 3e-3, schedule) == lr_at(s, 32, 3e-3, schedule)
            for s in range(1, run.branch.step + 1)
        )
        assert lr_at(run.branch.step + 1, steps, 3e-3, schedule) < lr_at(
            run.branch.step + 1, 32, 3e-3, schedule
        )
    # every branch starts from the trunk of its own interface and seed, whose recipe is its own but the budget
    trunks = {p.name: p for p in plans if p.branch is None}
    assert len(trunks) == 4
    for run in plans:
        if run.branch is not None:
            own = trunks[run.branch.trunk]
            assert (own.interface, own.seed) == (run.interface, run.seed)
            differ = ("budget", "checkpoint_steps")
            assert {k: v for k, v in own.recipe.items() if k not in differ} == {
                k: v for k, v in run.recipe.items() if k not in differ
            }


def test_branching_refuses_what_would_not_be_the_same_run(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    config = branched(tmp_path, data)
    config.train = {**RECIPE, "schedule": {"name": "cosine", "warmup_steps": 2}}
    with pytest.raises(ValueError, match="stable phase of a wsd schedule"):
        plan_runs(config)
    # all decay and no stable phase: nothing to branch from
    config = branched(tmp_path, data)
    config.train = {**RECIPE, "schedule": {"name": "wsd", "warmup_steps": 0, "decay_fraction": 1.0}}
    with pytest.raises(ValueError, match="cannot branch"):
        plan_runs(config)
    # compile: auto would compile a long trunk and not a short budget's own run
    config = branched(tmp_path, data)
    config.train = {**RECIPE, "compile": "auto"}
    with pytest.raises(ValueError, match="set compile: true or false"):
        plan_runs(config)
    config.train = {**RECIPE, "precision": "auto"}
    with pytest.raises(ValueError, match="set precision: fp32 or bf16"):
        plan_runs(config)
    with pytest.raises(ValueError, match="at least two budgets"):
        from_dict(CompareConfig, {"grid": {"budget": ["8 steps"], "branch": True}})


def test_decay_start_is_where_the_rate_leaves_its_peak() -> None:
    config = micro_config(Path("unused"), **{"schedule.name": "wsd", "schedule.decay_fraction": 0.2})
    for total in (10, 25, 100, 977):
        start = decay_start(total, config.schedule)
        assert lr_at(start, total, 1.0, config.schedule) == 1.0
        assert lr_at(start + 1, total, 1.0, config.schedule) < 1.0


def test_lr_grid_points_and_per_interface_rates(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    assert [rate_name(r) for r in (0.002, 0.0015, 1e-4, 0.01)] == ["2e-3", "1.5e-3", "1e-4", "1e-2"]
    config = branched(tmp_path, data)
    config.grid = from_dict(
        CompareConfig,
        {
            "interfaces": ["learned", "canonical"],
            "grid": {"lr": {"learned": [1e-3, 2e-3], "canonical": [2e-3, 4e-3]}},
        },
    ).grid
    plans = plan_runs(config)
    by_point: dict[str, set[str]] = {}
    for plan in plans:
        by_point.setdefault(plan.point, set()).add(plan.interface)
        assert plan.recipe["optim"]["lr"] == float(plan.point.removeprefix("lr"))
    assert by_point == {"lr1e-3": {"learned"}, "lr2e-3": {"learned", "canonical"}, "lr4e-3": {"canonical"}}
    with pytest.raises(ValueError, match=r"grid\.lr"):
        from_dict(CompareConfig, {"grid": {"lr": [0.001, -1]}})
    with pytest.raises(ValueError, match="choose one of the two"):
        from_dict(
            CompareConfig,
            {"grid": {"lr": [1e-3]}, "interface_train": {"canonical": {"optim": {"lr": 4e-3}}}},
        )


def test_a_rate_map_is_checked_against_the_sweeps_interfaces(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """issue 35: a map that leaves an interface without a rate, names no interface, or writes a rate as YAML text."""
    both = {"interfaces": ["learned", "canonical"]}
    with pytest.raises(
        ValueError, match=r"grid\.lr: lists rates for learned only, so canonical would train no run"
    ):
        from_dict(CompareConfig, {**both, "grid": {"lr": {"learned": [1e-3]}}})
    with pytest.raises(ValueError, match=r"grid\.lr: 'lerned' is not an interface"):
        from_dict(CompareConfig, {**both, "grid": {"lr": {"lerned": [1e-3], "canonical": [1e-3]}}})
    with pytest.raises(ValueError, match=r"grid\.lr\.canonical\[1\]: expected a positive number, got 'fast'"):
        from_dict(CompareConfig, {**both, "grid": {"lr": {"learned": [1e-3], "canonical": [1e-3, "fast"]}}})
    # `1e-3` without a dot is text to YAML: read as the number, as everywhere else in the config
    path = tmp_path / "c.yaml"
    path.write_text(
        "interfaces: [learned, canonical]\ngrid:\n  lr: {learned: [1e-3], canonical: [2e-3, 4e-3]}\n"
    )
    from tablefree.compare import load_compare_config

    config = load_compare_config(path)
    assert config.grid.lr == {"learned": [1e-3], "canonical": [2e-3, 4e-3]}
    assert [p.name for p in config.grid.points()] == ["lr1e-3", "lr2e-3", "lr4e-3"]
    # the same error from every command: the config is read first (--status, compare, --emit-sbatch)
    from tablefree.cli import main

    path.write_text("interfaces: [learned, canonical]\ngrid:\n  lr: {lerned: [1e-3], canonical: [1e-3]}\n")
    for extra in (["--status"], [], ["--emit-sbatch", str(tmp_path / "s.sbatch")]):
        assert main(["compare", "--config", str(path), f"out={tmp_path / 'out'}", *extra]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert (
            line.startswith(f"tablefree compare: error: {path}")
            and "grid.lr: 'lerned' is not an interface" in line
        )
    assert not (tmp_path / "s.sbatch").exists() and not (tmp_path / "out").exists()
    # fixed, --status lists the runs; run here (the local backend), nothing is "resubmitted"
    path.write_text(
        "interfaces: [learned, canonical]\ngrid:\n  lr: {learned: [1e-3], canonical: [1e-3]}\n"
        "dataset: {dir: data}\n"
    )
    assert main(["compare", "--config", str(path), f"out={tmp_path / 'out'}", "--status"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "0/6 done, 0 failed (re-run the command without --status to run the rest here)"


def test_interface_train_overrides_one_interface_only(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    config = branched(tmp_path, data)
    config.interface_train = {"canonical": {"optim": {"lr": 4e-3}}}
    rates = {(p.interface, p.point): p.recipe["optim"]["lr"] for p in plan_runs(config)}
    assert {rate for (name, _), rate in rates.items() if name == "canonical"} == {4e-3}
    assert {rate for (name, _), rate in rates.items() if name == "learned"} == {3e-3}


def test_selection_windows_are_disjoint_from_training_and_cover_the_rest(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", train_tokens=20_000)
    every = TokenLoader.from_dir(data, "train", 32, 4, shuffle=False)
    train = TokenLoader.from_dir(data, "train", 32, 4, shuffle=True, holdout_every=5)
    held = TokenLoader.from_dir(data, "train", 32, 4, shuffle=False, holdout_every=5, heldout=True)
    assert train.num_chunks + held.num_chunks == every.num_chunks and held.num_chunks == every.num_chunks // 5

    def windows(loader: TokenLoader) -> set[bytes]:
        chunks = loader.chunks(np.arange(loader.num_chunks))
        return {loader._window(int(c)).tobytes() for c in chunks}

    seen, set_aside = windows(train), windows(held)
    assert len(seen) == train.num_chunks and len(set_aside) == held.num_chunks  # each window once
    assert not seen & set_aside and seen | set_aside == windows(every)
    with pytest.raises(ValueError, match="holdout_every"):
        TokenLoader.from_dir(data, "train", 32, 4, holdout_every=1)
    with pytest.raises(ValueError, match="select_every"):
        micro_config(data, **{"data.select_every": 1})


@pytest.mark.slow
def test_a_branched_budget_is_the_run_trained_from_scratch(tmp_path: Path) -> None:
    """The branch resumes its trunk's stable phase and decays on its own: bit-identical weights and losses to a
    from-scratch run of its budget, for the decay's tokens only. With a selection split, each run is scored on
    the training windows it never saw."""
    from tablefree.train.trainer import train

    data = topics_dataset(tmp_path)
    config = branched(tmp_path, data)
    config.interfaces, config.seeds = ["canonical"], [1]
    config.train = {**RECIPE, "data": {"select_every": 10}}
    config.grid = from_dict(CompareConfig, {"grid": {"budget": ["8 steps", "16 steps"], "branch": True}}).grid
    result = run_sweep(config, report=False, log=lambda _: None)
    assert set(result["runs"].values()) == {"done"}
    sweep = tmp_path / "sweep" / "runs"
    branch = sweep / "8steps" / "canonical-s1"
    assert json.loads((branch / "branch.json").read_text())["step"] == 6

    scratch_config = micro_config(data, **{"data.select_every": 10})
    recipe = {**to_dict(scratch_config), **RECIPE, "data": {"dir": str(data), "select_every": 10}}
    recipe["model"] = {**RECIPE["model"], "interface": {"name": "canonical"}}
    from tablefree.train.recipe import TrainConfig

    scratch = tmp_path / "scratch"
    train(from_dict(TrainConfig, {**recipe, "budget": "8 steps", "seed": 1}), scratch)

    def final_weights(run_dir: Path) -> bytes:
        return (run_dir / "checkpoints" / "step_00000008" / "model.safetensors").read_bytes()

    assert final_weights(branch) == final_weights(scratch)

    def losses(run_dir: Path) -> list[tuple[int, float]]:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r.get("train_loss", r.get("val_loss_estimate"))) for r in records if "step" in r]

    assert losses(branch) == losses(scratch)
    assert (branch / "config.yaml").read_text() == (scratch / "config.yaml").read_text()
    selection = json.loads((branch / "selection.json").read_text())
    assert (
        selection["select_every"] == 10
        and selection["windows"] > 0
        and np.isfinite(selection["selection_loss"])
    )
    # the trunk keeps its branch point's checkpoint whatever keep_last says
    trunk = sweep / "16steps" / "canonical-s1"
    assert (trunk / "checkpoints" / "step_00000006" / "COMPLETE").exists()


@pytest.mark.slow
def test_learning_rate_check_chooses_on_the_selection_split(tmp_path: Path) -> None:
    """Each interface's rate is the lowest mean selection-split loss; the report shows the gap at the shared
    rate beside the gap at each interface's own rate."""
    data = topics_dataset(tmp_path)
    config = branched(tmp_path, data)
    config.train = {**RECIPE, "budget": "8 steps", "data": {"select_every": 8}}
    config.grid = from_dict(CompareConfig, {"grid": {"lr": [3e-4, 1e-2]}}).grid
    result = run_sweep(config, log=lambda _: None)
    assert set(result["runs"].values()) == {"done"}
    (check,) = result["report"]["statistics"]["learning_rate"]
    assert check["selection"]["name"] == "selection split" and check["rates"] == [3e-4, 1e-2]
    runs = tmp_path / "sweep" / "runs"
    for interface in ("learned", "canonical"):
        means = {
            rate: np.mean(
                [
                    json.loads((runs / point / f"{interface}-s{seed}" / "selection.json").read_text())[
                        "selection_loss"
                    ]
                    for seed in (0, 1)
                ]
            )
            for rate, point in ((3e-4, "lr3e-4"), (1e-2, "lr1e-2"))
        }
        assert check["per_interface"][interface]["chosen"] == min(means, key=means.get)
    (own,) = check["comparisons"]["own"]
    assert (own["a"], own["b"], own["point"]) == ("learned", "canonical", "own best rate")
    assert len(check["comparisons"]["shared"]) == 1
    markdown = (tmp_path / "sweep" / "report.md").read_text()
    assert "## Learning rate per interface" in markdown and "at each interface's own rate" in markdown
    # the band split at the own rates too, where they differ, and rebuilt from the shipped data with its choice
    bands = result["report"]["frequency_bands"]
    at_own = [section for section in bands if "own_points" in section]
    assert len(at_own) == (len(set(check["own_points"].values())) > 1)
    shipped = json.loads((tmp_path / "sweep" / DATA_FILE).read_text())
    assert shipped["own_rate_points"] == [check["own_points"]]
    rebuilt = statistics_from_data(tmp_path / "sweep" / DATA_FILE, n_boot=int(config.bootstrap))
    assert json.loads(json.dumps(rebuilt["frequency_bands"])) == json.loads(json.dumps(bands))
    # the regime beside the papers': this sweep's rows first (its learned model has 8 steps of 256 tokens)
    rows = result["report"]["regime"]
    # the two rate points share their regime: one row for it
    assert [row["study"].split(" ")[0] for row in rows] == ["this", "1.7B", "earlier"]
    assert rows[0]["study"] == "this sweep"
    assert rows[0]["tokens"] == 8 * 256 and rows[0]["code_bits"] == 9  # V = 512
    assert "## Regime" in markdown


def test_the_papers_regime_is_their_published_shape(tmp_path: Path) -> None:
    """The 1.7B study: V = 49,152, d = 2048, untied head; the table is 100,663,296 of 1,812,039,680 parameters."""
    from tablefree.report.regime import regime
    from tablefree.rundir import Run

    # one finished learned run of 1M tokens on a 1,000-parameter model with V = 64, d = 8
    (tmp_path / "config.yaml").write_text("model: {vocab_size: 64, d_model: 8}\n")
    run = Run(
        "learned",
        0,
        tmp_path,
        status={"state": "done"},
        summary={"tokens_seen": 1_000_000, "params": {"learned_total": 1_000}},
        eval={"tasks": {}},
    )
    rows = regime([run], [""])
    assert rows[0]["tokens_per_param"] == 1_000 and rows[0]["table_share"] == 64 * 8 / 1_000
    paper = rows[1]
    assert paper["table_share"] == 100_663_296 / 1_812_039_680
    assert paper["tokens_per_param"] == 100e9 / 1_812_039_680
    assert (paper["code_bits"], paper["d_model"]) == (16, 2048)


def test_a_sweep_grows_by_rates_for_one_interface(tmp_path: Path) -> None:
    """Extending a rate grid for one interface keeps the earlier points (trained for every interface)."""
    from tablefree.config_parsing import load_yaml
    from tablefree.sweep.record import write_sweep_config

    data = make_dataset(tmp_path / "data")
    out = tmp_path / "sweep"
    out.mkdir()
    config = branched(tmp_path, data)
    config.grid = from_dict(CompareConfig, {"grid": {"lr": [1e-3, 2e-3]}}).grid
    write_sweep_config(config, out)
    config.grid = from_dict(
        CompareConfig,
        {
            "interfaces": ["learned", "canonical"],
            "grid": {"lr": {"learned": [1e-3, 2e-3], "canonical": [1e-3, 2e-3, 4e-3]}},
        },
    ).grid
    write_sweep_config(config, out)
    points = {p["name"]: p.get("interfaces") for p in load_yaml(out / "compare.yaml")["grid_points"]}
    assert points == {"lr1e-3": None, "lr2e-3": None, "lr4e-3": ["canonical"]}
    # the report expects only the runs each point trains (a missing learned run at 4e-3 is not "unfinished")
    from tablefree.rundir import find_runs

    expected = {run.name for run in find_runs(out)}
    assert "lr4e-3/canonical-s0" in expected and "lr4e-3/learned-s0" not in expected
    # a model entry whose name now stands for other settings is refused
    config.grid = from_dict(CompareConfig, {"grid": {"model": [{"name": "m", "d_model": 32}]}}).grid
    write_sweep_config(config, out)
    config.grid = from_dict(CompareConfig, {"grid": {"model": [{"name": "m", "d_model": 64}]}}).grid
    with pytest.raises(ValueError, match="other settings"):
        write_sweep_config(config, out)


def test_a_budget_added_below_the_others_is_listed_first(tmp_path: Path) -> None:
    """The sweep's points follow this config's order, so the report lists budgets in the order the config
    gives them (the earlier run's other points after them), not in the order they were first run."""
    from tablefree.config_parsing import load_yaml
    from tablefree.sweep.record import write_sweep_config

    out = tmp_path / "sweep"
    out.mkdir()
    config = branched(tmp_path, make_dataset(tmp_path / "data"))
    config.grid = from_dict(CompareConfig, {"grid": {"budget": ["500k", "1M"]}}).grid
    write_sweep_config(config, out)
    config.grid = from_dict(CompareConfig, {"grid": {"budget": ["240k", "500k", "2M"]}}).grid
    write_sweep_config(config, out)
    names = [p["name"] for p in load_yaml(out / "compare.yaml")["grid_points"]]
    assert names == ["240k", "500k", "2M", "1M"]


def synthetic_runs(tmp_path: Path, budgets: list[int], seeds: list[int]) -> tuple[list, dict]:
    """Finished runs whose final losses follow known curves (learned E=3, canonical E=3.2), a branched grid."""
    from tablefree.rundir import Run

    runs, points = [], []
    for budget in budgets:
        points.append({"name": f"{budget}", "train": {"budget": budget}})
        for interface, floor in (("learned", 3.0), ("canonical", 3.2)):
            for seed in seeds:
                directory = tmp_path / f"{budget}" / f"{interface}-s{seed}"
                directory.mkdir(parents=True)
                (directory / "config.yaml").write_text(
                    "batch_tokens: 1000\nschedule: {name: wsd, warmup_steps: 2, decay_fraction: 0.2}\n"
                    "optim: {lr: 0.002}\n"
                )
                if budget != budgets[-1]:
                    trunk = f"{budgets[-1]}/{interface}-s{seed}"
                    record = {"trunk": trunk, "trunk_dir": f"../../{trunk}", "step": budget // 1250}
                    (directory / "branch.json").write_text(json.dumps(record))
                else:  # the trunk keeps a checkpoint at every branch step
                    with open(directory / "config.yaml", "a") as recipe:
                        recipe.write(f"checkpoint_steps: {[b // 1250 for b in budgets[:-1]]}\n")
                loss = floor + 40.0 * budget**-0.3 + 0.01 * seed
                runs.append(
                    Run(
                        interface,
                        seed,
                        directory,
                        point=f"{budget}",
                        status={"state": "done"},
                        summary={
                            "tokens_seen": budget,
                            "total_steps": budget // 1000,
                            "params": {"total_trainable": 10},
                        },
                        eval={"tasks": {"validation": {"metrics": {"val_loss": loss}}}},
                    )
                )
    return runs, {"grid_points": points}


@pytest.mark.slow  # 10-11 CPU s in the full suite: over the guard's limit for unmarked tests
def test_fitted_curves_of_a_branched_budget_grid(tmp_path: Path) -> None:
    from tablefree.report.curves import fitted_curves

    budgets = [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000]
    runs, config = synthetic_runs(tmp_path, budgets, [0, 1, 2])
    # seed 0's 250k runs trained from scratch (a budget added after its trunks finished): the budget is mixed
    for interface in ("learned", "canonical"):
        (tmp_path / "250000" / f"{interface}-s0" / "branch.json").unlink()
    (entry,) = fitted_curves(runs, config, ["learned", "canonical"], [], n_boot=200)
    fit = entry["fits"]["tokens"][0]
    assert fit["refused"] is None
    assert fit["interfaces"]["learned"]["fit"]["E"]["estimate"] == pytest.approx(3.0, abs=0.05)
    branching = entry["branching"]
    assert branching["points"]["250000"]["branched_from"] == "4000000"
    assert (branching["points"]["250000"]["branched"], branching["points"]["250000"]["runs"]) == (4, 6)
    assert branching["points"]["4000000"]["branched_from"] is None
    from tablefree.report.data import run_row
    from tablefree.report.markdown import _runs
    from tablefree.report.scaling_markdown import fitted_curves_section

    rows = [run_row(run) for run in runs]
    assert {r["branched_at_step"] for r in rows if r["point"] == "2000000"} == {1600}
    listing = _runs({"runs": rows})
    assert "| 2000000/learned-s1 (branch, step 1600) | done |" in listing
    assert "include the trunk's training up to that step" in listing
    table = fitted_curves_section({"statistics": {"fitted_curves": [entry]}})
    assert "| 250000 | 250k | 250 | 4 of 6 runs branched from the 4000000 run at step 200" in table
    assert "; 2 from scratch |" in table
    # trained: the trunk, plus each branch's tokens after its branch step (budget // 1250 steps of 1,000),
    # and seed 0's 250k runs whole
    per_seed = 4_000_000 + sum(b - (b // 1250) * 1000 for b in budgets[:-1])
    assert branching["tokens_trained"] == 2 * 3 * per_seed + 2 * (250_000 // 1250) * 1000
    assert branching["tokens_from_scratch"] == 2 * 3 * sum(budgets)
    assert any("backtest" in sentence for sentence in entry["fits"]["sentences"])
    # the fits recompute bit for bit from what the report ships: its observations and its recorded arguments
    from tablefree.report.curves import observations_of
    from tablefree.scaling import ScalingReportSpec, scaling_report

    shipped = json.loads(json.dumps(entry, allow_nan=False))  # as read back from report.json
    assert (
        scaling_report(observations_of(shipped), ScalingReportSpec(**shipped["fits"]["arguments"]))
        == shipped["fits"]
    )
    # the sweep config's predict_at (or the report's --predict-at) adds budgets the fits predict the gaps at
    (predicted,) = fitted_curves(runs, {**config, "predict_at": ["64M"]}, ["learned", "canonical"], [], 200)
    (gap_64m,) = [g for g in predicted["fits"]["tokens"][0]["pairs"][0]["gap_at"] if g["x"] == 64e6]
    assert gap_64m["reach"] == 16.0 and gap_64m["low"] < gap_64m["high"]
    assert any(s.startswith("At 64M tokens (16× beyond") for s in predicted["fits"]["sentences"])
    assert predicted["fits"]["arguments"]["predict_at"] == [64e6]
    with pytest.raises(ValueError, match=r"predict_at\[0\]: expected an integer such as"):
        fitted_curves(runs, config, ["learned", "canonical"], [], 200, predict_at=["lots"])
    from tablefree.compare import CompareConfig
    from tablefree.config_parsing import from_dict

    assert from_dict(CompareConfig, {"predict_at": ["17B", "100B"]}).predict_at == ["17B", "100B"]
    with pytest.raises(ValueError, match=r"predict_at\[1\]: expected an integer"):
        from_dict(CompareConfig, {"predict_at": ["17B", "a lot"]})
    with pytest.raises(ValueError, match=r"predict_at\[0\]: expected a positive token count"):
        from_dict(CompareConfig, {"predict_at": [0]})
    # two budgets: the fit is refused with its reason, never a trend from two points
    runs, config = synthetic_runs(tmp_path / "short", budgets[:2], [0, 1, 2])
    (entry,) = fitted_curves(runs, config, ["learned", "canonical"], [], n_boot=200)
    assert entry["fits"]["tokens"][0]["refused"]
    assert any(
        "No fit against tokens: a fit needs 5 or more budgets" in s for s in entry["fits"]["sentences"]
    )
    # what was measured between the two budgets is still said, without a fit (the gap is constant here)
    (step,) = [r for r in entry["fits"]["tokens"][0]["measured"]["steps"] if r["a"] == "learned"]
    assert step["reading"] == "not resolved" and step["change"] == pytest.approx(0, abs=1e-12)


def test_a_budget_added_after_its_trunk_finished_trains_from_scratch(tmp_path: Path) -> None:
    """A finished trunk kept no checkpoint at a budget added to the grid later: the branch trains from scratch
    (the same run); a trunk that has not finished is waited for, with the reason."""
    from tablefree.sweep.branching import start_branch
    from tablefree.sweep.plan import Branch, RunPlan

    trunk = tmp_path / "4M" / "learned-s0"
    trunk.mkdir(parents=True)
    run = RunPlan(
        "learned",
        0,
        tmp_path / "240k" / "learned-s0",
        TrainConfig(),
        "240k",
        Branch("4M/learned-s0", trunk, 47),
    )
    with pytest.raises(RuntimeError, match="the trunk run must finish first"):
        start_branch(run)
    (trunk / "summary.json").write_text(json.dumps({"completed": True}))
    assert start_branch(run) is False and not (run.directory / "checkpoints").exists()


def test_a_damaged_trunk_checkpoint_names_the_trunk_and_the_way_out(tmp_path: Path) -> None:
    """issue 35: the branch's copy would share the damaged file; the message names the trunk's file and says
    which directory to delete, and the branch directory is left without a half copy."""
    import hashlib

    from tablefree.sweep.branching import start_branch
    from tablefree.sweep.plan import Branch, RunPlan

    trunk = tmp_path / "4M" / "learned-s0"
    step = trunk / "checkpoints" / "step_00000047"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"written")
    digest = hashlib.sha256(b"written").hexdigest()
    (step / "COMPLETE").write_text(json.dumps({"sha256": {"model.safetensors": digest}}))
    (step / "model.safetensors").write_bytes(b"damaged")
    branch = tmp_path / "240k" / "learned-s0"
    run = RunPlan("learned", 0, branch, TrainConfig(), "240k", Branch("4M/learned-s0", trunk, 47))
    with pytest.raises(RuntimeError) as error:
        start_branch(run)
    message = str(error.value)
    assert f"{step / 'model.safetensors'}: damaged" in message
    assert f"delete {trunk} and re-run the command" in message
    assert not (branch / "checkpoints").exists() and not (branch / "branch.json").exists()


def test_a_branch_record_is_verified_against_its_trunk(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """issue 35: a deleted branch.json, or one whose step was edited, is refused by the report and by --status,
    naming the file and the way out: never counted as trained from scratch, nor at a step it did not start
    from."""
    from tablefree.cli import main
    from tablefree.sweep.branch_record import read_branch
    from tablefree.sweep.status import sweep_status

    data = topics_dataset(tmp_path)
    config = branched(tmp_path, data)
    config.interfaces, config.seeds = ["canonical"], [1]
    result = run_sweep(config, report=False, log=lambda _: None)
    assert set(result["runs"].values()) == {"done"}
    runs = tmp_path / "sweep" / "runs"
    trunk, short, middle = (runs / f"{n}steps" / "canonical-s1" for n in (32, 8, 16))
    assert read_branch(trunk) is None  # its records are shared with its branches, which are shorter
    assert (read_branch(short)["step"], read_branch(middle)["step"]) == (6, 12)
    plans = plan_runs(config)
    assert {entry["state"] for entry in sweep_status(config, plans).values()} == {"done"}
    record_path = short / "branch.json"
    record = json.loads(record_path.read_text())
    way_out = f"delete {short} and re-run the sweep command"

    def refused(pattern: str) -> None:
        with pytest.raises(ValueError, match=pattern) as error:
            read_branch(short)
        assert str(record_path) in str(error.value) and way_out in str(error.value)
        with pytest.raises(ValueError, match=pattern):
            sweep_status(config, plans)
        assert main(["report", str(tmp_path / "sweep")]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("tablefree report: error: ") and str(record_path) in line and way_out in line

    # the step moved to the other branch's: that checkpoint of the trunk is not the one it started from
    record_path.write_text(json.dumps({**record, "step": 12}))
    refused("is not 32steps/canonical-s1's checkpoint at step 12")
    # without the digests, its metrics past step 6 are its own, not the trunk's
    record_path.write_text(
        json.dumps({**{k: v for k, v in record.items() if k != "checkpoint_sha256"}, "step": 12})
    )
    refused(r"metrics.jsonl up to step 12 is not 32steps/canonical-s1's")
    # a step the trunk kept no checkpoint at
    record_path.write_text(json.dumps({**record, "step": 7}))
    refused("step 7 is no branch step of its trunk 32steps/canonical-s1")
    # an earlier step than the real one: the metrics after it are still the trunk's
    middle_record = json.loads((middle / "branch.json").read_text())
    (middle / "branch.json").write_text(
        json.dumps({**middle_record, "step": 6, "checkpoint_sha256": record["checkpoint_sha256"]})
    )
    with pytest.raises(ValueError, match="started from it later than step 6"):
        read_branch(middle)
    (middle / "branch.json").write_text(json.dumps(middle_record))
    # deleted: its copied records show where it came from
    record_path.unlink()
    refused(r"branch.json is missing, but .* begins with the records of 32steps/canonical-s1")
    # the trunk's records gone too, only the plan can tell: the step is the branch's own decay start
    (trunk / "metrics.jsonl").unlink()
    record_path.write_text(
        json.dumps({**{k: v for k, v in record.items() if k != "checkpoint_sha256"}, "step": 12})
    )
    assert read_branch(short)["step"] == 12
    with pytest.raises(
        ValueError, match=r"branch.json: step 12, but 8steps/canonical-s1's budget decays from step 6"
    ):
        sweep_status(config, plans)


def test_the_selection_split_is_checked_against_the_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """issue 35: a selection split that sets no window aside, or none for a rate grid that chooses on it, is
    refused in one line naming train.data.select_every before anything is written; a budget grid needs none."""
    from tablefree.cli import main

    data = make_dataset(tmp_path / "data")
    seq_len = RECIPE["seq_len"]
    windows = TokenLoader.from_dir(data, "train", seq_len, 1).num_chunks
    out = tmp_path / "sweep"

    def check(select_every: int, grid: dict) -> None:
        config = branched(tmp_path, data)
        config.train = {**RECIPE, "budget": "8 steps", "data": {"select_every": select_every}}
        config.grid = from_dict(CompareConfig, {"grid": grid}).grid
        check_sweep(config, plan_runs(config))

    from tablefree.sweep.plan import check_sweep

    check(windows, {"budget": ["8 steps", "16 steps"]})  # one window set aside
    check(0, {"budget": ["8 steps", "16 steps"]})  # a budget grid chooses nothing: no split is the default
    with pytest.raises(
        ValueError, match=rf"train\.data\.select_every: {windows + 1} sets none of the dataset's"
    ):
        check(windows + 1, {"budget": ["8 steps", "16 steps"]})
    with pytest.raises(ValueError, match=r"train\.data\.select_every: 0 leaves grid\.lr no selection split"):
        check(0, {"lr": [1e-3, 2e-3]})
    path = tmp_path / "c.yaml"
    for select_every, grid, expected in (
        (10**9, "budget: [8 steps, 16 steps]", "train.data.select_every: 1000000000 sets none"),
        (0, "lr: [1.0e-3, 2.0e-3]", "train.data.select_every: 0 leaves grid.lr no selection split"),
    ):
        path.write_text(
            f"interfaces: [learned]\ndataset: {{dir: {data}}}\ngrid: {{{grid}}}\n"
            f"train: {json.dumps({**RECIPE, 'budget': '8 steps', 'data': {'select_every': select_every}})}\n"
        )
        assert main(["compare", "--config", str(path), f"out={out}"]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("tablefree compare: error: recipe of ") and expected in line
        assert not out.exists()


@pytest.mark.parametrize(
    "budgets, schedule, expected",
    [
        (["8 steps", "16 steps"], "cosine", "grid.branch: 16steps/learned-s0 uses schedule.name='cosine'"),
        ([0, "16 steps"], "wsd", "grid.budget[0]: expected a positive budget"),
        (["8 steps", "0 steps"], "wsd", "grid.budget[1]: expected a positive budget"),
    ],
)
def test_a_branched_grid_that_cannot_branch_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, budgets: list, schedule: str, expected: str
) -> None:
    """issue 35: a branched grid with a cosine schedule or a zero budget: one line naming the field, no files."""
    from tablefree.cli import main

    data = make_dataset(tmp_path / "data")
    recipe = {**RECIPE, "schedule": {"name": schedule, "warmup_steps": 2}}
    path = tmp_path / "c.yaml"
    path.write_text(
        json.dumps(
            {
                "interfaces": ["learned"],
                "dataset": {"dir": str(data)},
                "grid": {"budget": budgets, "branch": True},
                "train": recipe,
            }
        )
    )
    before = sorted(tmp_path.rglob("*"))
    for extra in ([], ["--status"]):
        assert main(["compare", "--config", str(path), f"out={tmp_path / 'out'}", *extra]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("tablefree compare: error: ") and expected in line, line
    assert sorted(tmp_path.rglob("*")) == before
