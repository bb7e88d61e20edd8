"""What a user still tripped on in a sweep (issue 43, items 4-10): a branch record checked before anything
trains, a retrained trunk accepted when its branches' inputs are unchanged, the report's tables from one set of
finished runs, the few-seeds caveat, the figures, per-trunk sbatch dependencies and `--status` mid-sweep."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sweep_helpers import BRANCH_RECIPE as RECIPE
from sweep_helpers import topics_dataset
from tablefree.compare import CompareConfig, run_sweep
from tablefree.config_parsing import from_dict
from tablefree.sweep.plan import Branch, RunPlan
from tablefree.train.recipe import TrainConfig


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return topics_dataset(tmp_path_factory.mktemp("data"))


def branched(out: Path, data: Path, seeds: list[int]) -> CompareConfig:
    """One interface, three budgets branched from the largest: a trunk and two branches per seed."""
    return from_dict(
        CompareConfig,
        {
            "name": "branch",
            "train": RECIPE,
            "dataset": {"dir": str(data)},
            "interfaces": ["canonical"],
            "seeds": seeds,
            "grid": {"budget": ["8 steps", "16 steps", "32 steps"], "branch": True},
            "eval": {"tasks": ["validation"], "val_limit": 4},
            "out": str(out),
            "bootstrap": 100,
        },
    )


def quiet(_: str) -> None:
    pass


@pytest.mark.slow
def test_a_deleted_branch_record_is_refused_before_anything_trains(
    tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5: a finished branch whose branch.json was deleted was found only by the report, after every other
    run of the sweep had trained; now the sweep refuses before the first run, naming the file."""
    out = tmp_path / "sweep"
    assert set(run_sweep(branched(out, dataset, [1]), report=False, log=quiet)["runs"].values()) == {"done"}
    record = out / "runs" / "8steps" / "canonical-s1" / "branch.json"
    record.unlink()
    trained = []
    monkeypatch.setattr(
        "tablefree.sweep.local.execute_run", lambda config, run, *rest: trained.append(run.name)
    )
    with pytest.raises(
        ValueError, match=r"branch\.json is missing, but .* begins with the records of"
    ) as error:
        run_sweep(branched(out, dataset, [1, 2]), report=False, log=quiet)  # seed 2 is new: runs to train
    assert str(record) in str(error.value) and trained == []
    record.write_text('{"trunk": "32steps/canonical-s1", "trunk_dir": ')  # damaged: cut short
    with pytest.raises(
        ValueError, match=r"branch\.json: malformed JSON .*; delete .* and re-run the sweep command"
    ):
        run_sweep(branched(out, dataset, [1, 2]), report=False, log=quiet)
    assert trained == []


@pytest.mark.slow
def test_a_retrained_trunk_is_accepted_when_what_its_branches_depend_on_is_unchanged(
    tmp_path: Path, dataset: Path
) -> None:
    """Item 6: the trunk deleted and trained again gives bit-identical weights, optimizer state and data
    position, but another train_state.pt (its clock and unseeded random states): its finished branches stand.
    A branch whose trunk's weights did change is refused, saying so."""
    from tablefree.report import build_report
    from tablefree.sweep.branch_record import read_branch

    out = tmp_path / "sweep"
    config = branched(out, dataset, [1])
    run_sweep(config, report=False, log=quiet)
    runs = out / "runs"
    short = runs / "8steps" / "canonical-s1"
    original = json.loads((short / "branch.json").read_text())
    shutil.rmtree(runs / "32steps" / "canonical-s1")
    result = run_sweep(config, report=False, log=quiet)
    assert result["runs"] == {name: "done" for name in result["runs"]} and len(result["runs"]) == 3
    retrained = json.loads((runs / "32steps/canonical-s1/checkpoints/step_00000006/COMPLETE").read_text())
    assert retrained["sha256"] != original["checkpoint_sha256"]  # the file digests do differ
    assert read_branch(short)["step"] == 6
    report = build_report(out, n_boot=50)
    assert {row["name"]: row["branched_at_step"] for row in report["runs"]}["8steps/canonical-s1"] == 6
    # a record written before depends_sha256 existed: the branch's own copy of the checkpoint is the reference
    (short / "branch.json").write_text(
        json.dumps({k: v for k, v in original.items() if k != "depends_sha256"})
    )
    assert read_branch(short)["step"] == 6
    # what the branch trained from is not what the trunk holds now: refused with the true reason
    changed = {**original["depends_sha256"], "weights": "0" * 64}
    (short / "branch.json").write_text(json.dumps({**original, "depends_sha256": changed}))
    with pytest.raises(ValueError, match=r"its weights differs from what the branch started from; delete "):
        read_branch(short)


def test_a_branch_of_a_deleted_trunk_says_the_trunk_is_gone(tmp_path: Path) -> None:
    """Item 6: "the trunk run must finish first" was said of a trunk that had been deleted."""
    from tablefree.sweep.branching import start_branch

    trunk = tmp_path / "32steps" / "canonical-s0"
    run = RunPlan(
        "canonical",
        0,
        tmp_path / "8steps" / "canonical-s0",
        TrainConfig(),
        "8steps",
        Branch("32steps/canonical-s0", trunk, 6),
    )
    with pytest.raises(RuntimeError) as error:
        start_branch(run)
    assert f"run directory {trunk} does not exist" in str(error.value)
    assert "must finish first" not in str(error.value)


def test_status_during_a_running_sweep_names_who_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Item 10: `--status` while a sweep runs here told the user to re-run the command; it now says the sweep is
    running and who holds it, and a second `compare` on the same directory is refused naming the holder."""
    import os
    import socket

    from tablefree.cli import main
    from tablefree.sweep.status import hold_sweep
    from train_helpers import make_dataset

    data = make_dataset(tmp_path / "data")
    out = tmp_path / "sweep"
    path = tmp_path / "c.yaml"
    path.write_text(
        f"interfaces: [canonical]\nseeds: [0]\ndataset: {{dir: {data}}}\nout: {out}\n"
        f"eval: {{tasks: [validation]}}\ntrain: {json.dumps({**RECIPE, 'budget': '8 steps'})}\n"
    )
    lock = out / ".compare.lock"
    with hold_sweep(out):
        assert main(["compare", "--config", str(path), "--status"]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert (
            f"the sweep is running here (pid {os.getpid()} on host {socket.gethostname()}; lock {lock})"
            in last
        )
        assert "re-run" not in last
        assert main(["compare", "--config", str(path)]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert (
            line.startswith("tablefree compare: error: ")
            and f"pid {os.getpid()}" in line
            and str(lock) in line
        )
    # released: a run left marked running by a killed sweep is named as stopped, and re-running is the way on
    run = out / "runs" / "canonical-s0"
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "running"}))
    assert main(["compare", "--config", str(path), "--status"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "no process runs the sweep now, so canonical-s0 stopped" in last and "re-run the command" in last


def test_emit_sbatch_makes_each_branch_wait_on_its_own_trunk_only(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9: every branch waited (afterok) on the whole trunk array, so one failed trunk held back the
    branches of every other trunk. The submit script, run against a stand-in sbatch that records its calls,
    submits each trunk's branches as their own array depending on that trunk's array task alone."""
    import subprocess

    from tablefree.sweep.slurm import emit_sbatch

    config = branched(tmp_path / "sweep", dataset, [0, 1])
    config.interfaces = ["learned", "canonical"]
    config.launch.slurm.array_parallelism = 8
    logged: list[str] = []
    emit_sbatch(config, tmp_path / "sweep.sbatch", log=logged.append)
    submit = tmp_path / "sweep-submit.sh"
    assert f"`bash {submit}`" in logged[-1]

    def lines(script: Path) -> list[str]:
        block = script.read_text().split("RUNS=(\n")[1].split("\n)")[0]
        return [line.rsplit(" ", 1)[1].strip("'") for line in block.splitlines()]

    first, branches = lines(tmp_path / "sweep.sbatch"), lines(tmp_path / "sweep-branches.sbatch")
    assert first == [f"32steps/{i}-s{s}" for s in (0, 1) for i in ("learned", "canonical")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {calls}\necho "4242;cluster"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    subprocess.run(["bash", str(submit)], check=True, capture_output=True)
    submitted = calls.read_text().splitlines()
    assert submitted[0] == f"--parsable {tmp_path / 'sweep.sbatch'}"
    waits = {}
    for call in submitted[1:]:
        options = dict(part.split("=", 1) for part in call.split() if part.startswith("--") and "=" in part)
        assert call.endswith(str(tmp_path / "sweep-branches.sbatch"))
        low, _, high = options["--array"].split("%")[0].partition("-")
        for index in range(int(low), int(high or low) + 1):
            waits[branches[index]] = options["--dependency"]
    # every branch, once, waiting on the task of its own trunk in the first array
    assert sorted(waits) == sorted(branches) and len(branches) == 8
    for name, dependency in waits.items():
        trunk = "32steps/" + name.split("/")[1]
        assert dependency == f"afterok:4242_{first.index(trunk)}"


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> Path:
    """A finished branched budget grid, 2 interfaces x 2 seeds x 3 budgets of one model size, not reported."""
    out = tmp_path_factory.mktemp("grid") / "sweep"
    config = branched(out, dataset, [0, 1])
    config.interfaces = ["learned", "canonical"]
    assert set(run_sweep(config, report=False, log=quiet)["runs"].values()) == {"done"}
    return out


def copy_of(sweep: Path, where: Path) -> Path:
    shutil.copytree(sweep, where, symlinks=True)
    return where


@pytest.mark.slow
def test_one_missing_summary_leaves_the_run_out_of_every_table(grid_sweep: Path, tmp_path: Path) -> None:
    """Item 4: a finished run's deleted summary.json entered the grid table with 0 tokens and no parameters and
    the branching table as `| 0 | None |`, left the regime table, and the header said 12 of 12 finished while
    `--status` said 11. Now the report is the report of the sweep without that run, the header counts 11 of 12
    as `--status` does, and the run is named with the reason."""
    from tablefree.report import build_report
    from tablefree.sweep.status import sweep_status

    missing = copy_of(grid_sweep, tmp_path / "missing")
    (missing / "runs" / "16steps" / "canonical-s0" / "summary.json").unlink()
    absent = copy_of(grid_sweep, tmp_path / "absent")
    shutil.rmtree(absent / "runs" / "16steps" / "canonical-s0")
    with_gap, without = build_report(missing, n_boot=50), build_report(absent, n_boot=50)
    for key in ("points", "metrics", "params", "regime", "statistics"):
        assert with_gap[key] == without[key], key
    markdown = (missing / "report.md").read_text()
    assert "11 of 12 runs finished" in markdown
    assert "- 16steps/canonical-s0: summary.json is missing or unreadable" in markdown
    assert "– params" not in markdown and "| 0 | None |" not in markdown
    config = branched(missing, Path("unused"), [0, 1])
    config.interfaces = ["learned", "canonical"]
    from tablefree.sweep.plan import plan_runs

    states = [entry["state"] for entry in sweep_status(config, plan_runs(config)).values()]
    assert states.count("done") == 11
    rows = {row["name"]: row["state"] for row in with_gap["runs"]}
    assert rows["16steps/canonical-s0"] == "todo"  # as --status calls it


@pytest.mark.slow
def test_few_seeds_are_said_once_with_the_seeds_that_would_resolve(grid_sweep: Path, tmp_path: Path) -> None:
    """Item 7: with 2 seeds every comparison repeated the same caveat and none said what more seeds would give;
    the token ratio called every interface but learned "the fixed code" (separable has trainable codebooks)."""
    from tablefree import stats
    from tablefree.report import build_report

    sweep = copy_of(grid_sweep, tmp_path / "sweep")
    report = build_report(sweep, n_boot=50)
    markdown = (sweep / "report.md").read_text()
    comps = report["statistics"]["comparisons"]
    assert len(comps) == 3 and all(c["seeds"] == 2 for c in comps)
    assert markdown.count("nothing is called resolved") == 1
    assert not any("degree of freedom" in c["sentence"] or "3 or more" in c["sentence"] for c in comps)
    caveat = report["statistics"]["few_seeds"]
    largest = max(comps, key=lambda c: abs(c["estimate"]) / c["seed_se"])
    assert caveat["largest"]["point"] == largest["point"] and caveat["comparisons"] == 3
    assert caveat["seeds_needed"] == stats.seeds_to_resolve(largest["estimate"], largest["seed_se"] * 2**0.5)
    assert f"about **{caveat['seeds_needed']} seeds**" in markdown
    assert "standard deviation of the per-seed differences observed over 2 seeds" in markdown
    assert "fixed code" not in markdown


def test_seeds_to_resolve_is_the_power_of_a_paired_t_test() -> None:
    """The seed count has the promised power: a simulated paired t test over that many seeds resolves the
    difference about 80% of the time, and over one seed fewer less often."""
    import numpy as np

    from tablefree import stats

    rng = np.random.default_rng(0)

    def power(n: int, effect: float, sd: float, family: int) -> float:
        draws = rng.normal(effect, sd, size=(6000, n))
        t = draws.mean(axis=1) / (draws.std(axis=1, ddof=1) / np.sqrt(n))
        return float(np.mean(np.abs(t) > stats.student_t_ppf(1 - 0.05 / family / 2, n - 1)))

    for effect, sd, family in ((0.05, 0.04, 1), (0.62, 0.5, 9), (0.1, 0.2, 3)):
        n = stats.seeds_to_resolve(effect, sd, family)
        assert n is not None and n >= 3
        assert power(n, effect, sd, family) >= 0.76, (effect, sd, n)
        if n > 3:
            assert power(n - 1, effect, sd, family) < 0.84, (effect, sd, n)
    assert stats.seeds_to_resolve(0.0, 1.0) is None and stats.seeds_to_resolve(1e-6, 1.0) is None


@pytest.mark.slow
def test_scaling_figure_of_one_model_size_draws_no_parameter_panel(grid_sweep: Path, tmp_path: Path) -> None:
    """Item 8: with one model size the right panel of scaling.png was vertical lines over overlapping tick
    labels of one parameter count; it is left out, and the title says why."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from tablefree.report import build_report, figures
    from tablefree.rundir import find_runs

    sweep = copy_of(grid_sweep, tmp_path / "sweep")
    report = build_report(sweep, n_boot=50)
    titles = {figure["path"]: figure["title"] for figure in report["figures"]}
    assert "not against parameters: one model size per interface" in titles["figures/scaling.png"]
    figure, title = figures._scaling(find_runs(sweep), report, figures.interface_colors(report["interfaces"]))
    (ax,) = figure.axes
    assert ax.get_xlabel().startswith("tokens seen") and title == titles["figures/scaling.png"]


def test_gap_figure_subtitle_says_bars_where_it_draws_bars() -> None:
    """Item 8: a grid point with one in-training point per curve gets error bars, and the subtitle promised a
    band."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.collections import PolyCollection

    from tablefree.report import figures

    point = {"tokens": 1000.0, "estimate": 0.1, "low": 0.0, "high": 0.2}
    gaps = [{"point": "8k", "a": "learned", "b": "canonical", "seeds": 2, "curve": [point], "trend": None}]
    figure = figures._gap(
        [], {"statistics": {"gap": gaps}}, figures.interface_colors(["learned", "canonical"])
    )
    (ax,) = [a for a in figure.axes if a.get_visible()]
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)  # no band drawn
    assert "bars: 95% t interval over seeds" in ax.get_title() and "band" not in ax.get_title()
    one_seed = [{**gaps[0], "seeds": 1, "curve": [{**point, "low": None, "high": None}] * 2}]
    figure = figures._gap(
        [], {"statistics": {"gap": one_seed}}, figures.interface_colors(["learned", "canonical"])
    )
    (ax,) = [a for a in figure.axes if a.get_visible()]
    assert "no band: one seed" in ax.get_title()
