"""The sweep's plan, built once from its config: every run (grid point, interface, seed) with its recipe parsed
once as a ``TrainConfig``, in the order the runs train, and for a branched budget grid the trunk each
shorter budget starts from (``branch_budgets``). Both executors (``tablefree.sweep.local``,
``tablefree.sweep.slurm``) run this plan; ``check_sweep`` checks it whole before anything trains."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tablefree.config_parsing import from_dict, to_dict
from tablefree.data.loader import read_manifest, split_windows
from tablefree.evaluate import get_task
from tablefree.evaluate.selection import (
    MIN_SELECTION_TOKENS,
    MIN_SELECTION_WINDOWS,
    selection_split_shortfall,
)
from tablefree.evaluate.tasks import check_task_files
from tablefree.params import param_breakdown
from tablefree.rundir import run_directory, run_name
from tablefree.sweep.config import CompareConfig, base_recipe, deep_merge
from tablefree.sweep.grid import BUDGET, GridPoint, run_recipe, same_except
from tablefree.train.recipe import TrainConfig, budget_steps, decay_start, lr_at
from tablefree.train.recipe import plan as step_plan


@dataclass
class Branch:
    """Where a budget branch starts: the trunk run (the largest budget of its group) and the step, the
    branch's own decay start, whose checkpoint the trunk keeps."""

    trunk: str  # the trunk run's name
    directory: Path  # the trunk run's directory
    step: int


@dataclass
class RunPlan:
    interface: str
    seed: int
    directory: Path
    train_config: TrainConfig  # the run's recipe, parsed once; the one copy the sweep changes
    point: str = ""
    branch: Branch | None = None

    @property
    def recipe(self) -> dict[str, Any]:
        """The recipe as a dict (the run's recipe.yaml under torchrun; grouping runs by what they share)."""
        return to_dict(self.train_config)

    @property
    def name(self) -> str:
        return run_name(self.interface, self.seed, self.point)

    @property
    def select_every(self) -> int:
        return self.train_config.data.select_every


def plan_runs(config: CompareConfig) -> list[RunPlan]:
    """Every run of the sweep (grid point, interface, seed), each recipe checked as a training config."""
    recipe = base_recipe(config)
    plans = []
    # Seeds outer, interfaces inner: a sweep stopped early still holds complete seed-paired sets.
    for point in config.grid.points() or [GridPoint("", {})]:
        point_recipe = deep_merge(recipe, point.train)
        for seed in config.seeds:
            for interface in point.interfaces or config.interfaces:
                if interface not in config.interfaces:
                    continue
                run = run_recipe(
                    deep_merge(point_recipe, config.interface_train.get(interface, {})), interface, seed
                )
                name = run_name(interface, seed, point.name)
                train_config = from_dict(TrainConfig, run, where=f"recipe of {name}")  # fail early, by name
                directory = run_directory(config.out_dir, interface, seed, point.name)
                plans.append(RunPlan(interface, seed, directory, train_config, point.name))
    if not plans:
        raise ValueError(f"{config.name}: its grid and interfaces {config.interfaces} leave no run to train")
    return branch_budgets(plans) if config.grid.branch else plans


# the fields in which the runs of one branching group differ
BRANCH_FIELDS = (BUDGET, "checkpoint_steps")


def branch_budgets(plans: list[RunPlan]) -> list[RunPlan]:
    """Budget branching: in each group of runs that differ only in their budget, the largest budget is the trunk
    and keeps a checkpoint at every other budget's decay start; the others start there. Ordered trunk first,
    then its branches (shortest first), group by group in the sweep's order."""
    groups: dict[str, list[RunPlan]] = {}
    for run in plans:
        groups.setdefault(same_except(run.recipe, *BRANCH_FIELDS), []).append(run)
    ordered = []
    for group in groups.values():
        steps = {
            run.name: budget_steps(run.train_config.budget, run.train_config.batch_tokens) for run in group
        }
        group.sort(key=lambda run: steps[run.name])
        trunk, branches = group[-1], group[:-1]
        schedule = trunk.train_config.schedule
        if schedule.name != "wsd":
            raise ValueError(
                f"grid.branch: {trunk.name} uses schedule.name={schedule.name!r}; budgets branch only from the "
                "stable phase of a wsd schedule (set schedule.name: wsd)"
            )
        if not isinstance(trunk.train_config.compile, bool):
            raise ValueError(
                f"grid.branch: {trunk.name} has compile: {trunk.train_config.compile!r}; set compile: true or "
                "false, since `auto` decides per budget (a long trunk compiles, a short budget would not) and a "
                "branch would then not compute what its budget trained from scratch computes"
            )
        if trunk.train_config.precision == "auto":
            raise ValueError(
                f"grid.branch: {trunk.name} has precision: auto; set precision: fp32 or bf16, since `auto` is "
                "decided by each run from the measured matmul rates, which can differ between a trunk and a branch "
                "trained later"
            )
        points = []
        for run in branches:
            start = decay_start(steps[run.name], schedule)
            peak = run.train_config.optim.lr
            # the branch must be the very run a from-scratch training of its budget would be up to `start`
            same = all(
                lr_at(s, steps[run.name], peak, schedule) == lr_at(s, steps[trunk.name], peak, schedule)
                for s in range(1, start + 1)
            )
            if start < 1 or not same or start in points:
                raise ValueError(
                    f"grid.branch: {run.name} ({steps[run.name]} steps) cannot branch from {trunk.name} "
                    f"({steps[trunk.name]} steps): its decay would start at step {start}, where the two "
                    "schedules must agree and no other budget may branch; use budgets further apart"
                )
            points.append(start)
            run.branch = Branch(trunk.name, trunk.directory, start)
        trunk.train_config = dataclasses.replace(trunk.train_config, checkpoint_steps=sorted(points))
        ordered += [trunk, *branches]
    return ordered


def check_sweep(config: CompareConfig, plans: list[RunPlan]) -> None:
    """Everything knowable before training, for every run: ``check_plans``, its recipe builds a model
    (interface options included) on the dataset's vocabulary, its step plan holds (batch, budget, warmup), and
    its selection split (``data.select_every``) sets windows aside and leaves most of them to training."""
    check_plans(config, plans)
    manifest = None
    for plan in plans:
        train_config = plan.train_config
        if manifest is None and (Path(train_config.data.dir) / "manifest.json").exists():
            manifest = read_manifest(train_config.data.dir)
        try:
            model_config = train_config.model.build(manifest.get("vocab_size") if manifest else None)
            param_breakdown(model_config)  # builds the model on the meta device
            steps = step_plan(train_config, model_config, max(1, config.launch.nproc_per_node))  # warmup
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"recipe of {plan.name}: {error}") from error
        if manifest is not None and plan.select_every:
            check_selection_split(
                plan,
                split_windows(manifest, train_config.data.dir, "train", steps.seq_len),
                steps.seq_len,
                chooses=bool(config.grid.lr),
            )


def check_plans(config: CompareConfig, plans: list[RunPlan]) -> None:
    """What needs no dataset, checked before one is prepared: the evaluation's files (``check_eval_data``), and
    a selection split in every run of a rate grid, which chooses each interface's rate on it."""
    check_eval_data(config)
    if config.grid.lr:
        for plan in plans:
            if not plan.select_every:
                raise ValueError(
                    f"recipe of {plan.name}: train.data.select_every: 0 leaves grid.lr no selection split to "
                    "choose each interface's rate on; set train.data.select_every: k (every k-th training window "
                    "held out, e.g. 50)"
                )


def check_selection_split(plan: RunPlan, windows: int, seq_len: int, chooses: bool = False) -> None:
    """``data.select_every: k`` must set at least one of the dataset's training windows aside (k <= windows);
    k >= 2, which the recipe checks, leaves most of them to training. When a rate grid chooses on it
    (``chooses``), the windows of ``seq_len`` tokens set aside (every k-th: windows // k) must reach the minimum
    a rate is chosen on (``MIN_SELECTION_WINDOWS`` windows and ``MIN_SELECTION_TOKENS`` tokens)."""
    if plan.select_every > windows:
        raise ValueError(
            f"recipe of {plan.name}: train.data.select_every: {plan.select_every} sets none of the dataset's "
            f"{windows:,} training windows aside (every k-th is held out); expected 2 to {windows:,}"
        )
    held = windows // plan.select_every
    shortfall = selection_split_shortfall(held, held * seq_len) if chooses else None
    if shortfall:
        needed = max(MIN_SELECTION_WINDOWS, -(-MIN_SELECTION_TOKENS // seq_len))
        largest = windows // needed
        fix = (
            f"expected 2 to {largest:,} (every k-th of the {windows:,} windows of {seq_len} tokens)"
            if largest >= 2
            else f"the dataset has {windows:,} windows of {seq_len} tokens, too few to hold out {needed} and "
            "train on the rest: a larger dataset, or no grid.lr"
        )
        raise ValueError(
            f"recipe of {plan.name}: train.data.select_every: {plan.select_every} sets aside {held:,} windows "
            f"({held * seq_len:,} tokens) for grid.lr to choose each interface's rate on, too few ({shortfall}; "
            f"a rate needs at least {MIN_SELECTION_WINDOWS} windows and {MIN_SELECTION_TOKENS:,} tokens); {fix}"
        )


def check_eval_data(config: CompareConfig) -> None:
    """Fail before any training when a requested benchmark's files are missing: one error listing every missing
    file, the command that fetches them and compare's own setting for where they are (``eval.data_dir``)."""
    tasks = [get_task(name) for name in config.eval.tasks if name != "validation"]
    try:
        check_task_files(tasks, config.eval.data_dir, point_at="eval.data_dir=DIR (command line or config)")
    except FileNotFoundError as error:
        raise FileNotFoundError(f"eval.tasks: {error}; or leave those tasks out of eval.tasks") from None
