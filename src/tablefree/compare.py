"""The matched interface comparison: one training recipe, every (interface, seed) pair, evaluated and reported.

``run_sweep(config)`` trains each run with ``tablefree.train.trainer.train`` (or ``tablefree train`` under
torchrun), evaluates it with ``tablefree.evaluate.run_eval`` (per-example records kept for the paired
bootstrap) and writes the report with ``tablefree.report.build_report``. Per run only the interface and the
seed change; the trainer makes the backbone initialisation and data order identical across interfaces for a
seed. Layout of the sweep directory::

    OUT/compare.yaml                 # the resolved sweep config (recipe, interfaces, seeds, eval, launch)
    OUT/runs/{interface}-s{seed}/    # a training run dir, plus eval.json, eval_examples.jsonl, status.json
    OUT/runs/{point}/{interface}-s{seed}/   # the same per grid point, when the config has a grid
    OUT/report.md, report.json, figures/*.png

The layout's names live in ``tablefree.rundir``. The whole sweep (every run's recipe and model, the evaluation
settings, the benchmark files) is checked before anything trains.

Resumable: a run with a completed summary and evaluation results for every requested task is skipped; a
trained but unevaluated run is only evaluated; any other run resumes from its newest checkpoint (or starts).
A run that fails has its traceback written to ``error.txt`` and the sweep goes on with the others.

``launch.backend: slurm`` submits the runs instead, as one SLURM job array whose tasks call ``run_job`` (the
same ``execute_run``) and returns; ``sweep_status`` reads each run's state back (``tablefree.launch``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tablefree.config_parsing import (
    from_dict,
    from_dict_with_overrides,
    load_yaml,
    parse_token_budgets,
    to_dict,
)
from tablefree.fileio import read_json, write_json_atomic, write_text_atomic
from tablefree.interfaces import INTERFACES
from tablefree.launch import SlurmSpec
from tablefree.rundir import RUN_FILES, SWEEP_CONFIG, run_directory, run_name


@dataclass
class DatasetSpec:
    """The prepared dataset the runs train on. When ``dir`` has no manifest and ``corpus`` is set, the sweep
    prepares it first with ``tablefree.data.prepare.prepare_dataset``."""

    dir: str = ""  # empty: the training recipe's data.dir
    corpus: str | None = None
    tokenizer: str | None = None  # None: train a byte-level BPE of vocab_size on the corpus
    vocab_size: int | None = None  # None: prepare_dataset's default (used only when the sweep prepares)
    val_fraction: float | None = None  # None: prepare_dataset's default
    val_documents: int | None = None  # None: prepare_dataset's default (at least 20 validation documents)
    val_section_chars: int | None = None  # None: prepare_dataset's default (long books held out in sections)
    gutenberg: bool = False  # strip Project Gutenberg headers and footers
    text_field: str = "text"
    workers: int | None = None


@dataclass
class EvalSpec:
    tasks: list[str] = field(default_factory=lambda: ["validation"])  # "validation" and/or benchmark names
    data_dir: str | None = None  # benchmark files; None: $TABLEFREE_EVAL_DATA, then ~/.cache/tablefree/eval
    limit: int | None = None  # first N documents per benchmark (None: the full sets)
    val_limit: int | None = None  # first N validation windows of max_seq_len tokens (None: the whole split)
    batch_size: int = 32
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # the forward pass's precision, as `tablefree eval --dtype`: auto | fp32 | bf16

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("eval.tasks: expected at least one task (validation and/or benchmark names)")
        for key in ("limit", "val_limit"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(
                    f"eval.{key}: expected a positive number of documents or null (all), got {value}"
                )
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size: expected a positive integer, got {self.batch_size}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ValueError(f"eval.dtype: expected auto, fp32 or bf16, got {self.dtype!r}")


@dataclass
class GridSpec:
    """Several model sizes, learning rates and/or budgets under one recipe: every combination is a grid point,
    and every grid point trains every (interface, seed). Empty lists: the recipe's own model, rate and budget.

    ``lr`` is one list for every interface, or ``{interface: [rates]}`` (a point then trains only the interfaces
    that list its rate). ``branch: true`` (``wsd`` schedules) trains each (model, rate, interface, seed) once, to
    the largest budget, and starts every shorter budget from that run's checkpoint at the shorter budget's own
    decay start: the same run as one trained from scratch, for only its decay's tokens."""

    model: list[dict[str, Any]] = field(default_factory=list)  # e.g. [{d_model: 128, n_layers: 4}, ...]
    lr: list[float] | dict[str, list[float]] = field(default_factory=list)  # e.g. [1e-3, 2e-3, 4e-3]
    budget: list[str | int] = field(default_factory=list)  # e.g. [500k, 1M, 2.5M]
    branch: bool = False

    def __post_init__(self) -> None:
        rates = self.lr.values() if isinstance(self.lr, dict) else [self.lr]
        for listed in rates:
            if not isinstance(listed, list) or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in listed
            ):
                raise ValueError(
                    f"grid.lr: expected a list of positive rates (or one per interface), got {self.lr}"
                )
        if self.branch and len(self.budget) < 2:
            raise ValueError(
                f"grid.branch: needs at least two budgets to branch, got grid.budget={self.budget}"
            )

    def rates(self) -> list[float]:
        """Every rate of the grid, in order of first mention."""
        listed = [r for rs in self.lr.values() for r in rs] if isinstance(self.lr, dict) else self.lr
        return list(dict.fromkeys(float(r) for r in listed))

    def interfaces_at(self, lr: float | None) -> list[str] | None:
        """The interfaces a rate is trained for (None: every interface)."""
        if lr is None or not isinstance(self.lr, dict):
            return None
        return [name for name, rates in self.lr.items() if lr in [float(r) for r in rates]]

    def points(self) -> list[dict[str, Any]]:
        """[{"name", "train": overrides, "interfaces": None or names}] in order (models outer, then rates, budgets
        inner); [] without a grid."""
        if not self.budget and not self.model and not self.lr:
            return []
        points = []
        for model, lr, budget in itertools.product(
            self.model or [None], self.rates() or [None], self.budget or [None]
        ):
            overrides: dict[str, Any] = {}
            if model is not None:
                overrides["model"] = {k: v for k, v in model.items() if k != "name"}
            if lr is not None:
                overrides["optim"] = {"lr": lr}
            if budget is not None:
                overrides["budget"] = budget
            point = {"name": point_name(model, budget, lr), "train": overrides}
            if self.interfaces_at(lr) is not None:
                point["interfaces"] = self.interfaces_at(lr)
            points.append(point)
        names = [p["name"] for p in points]
        if len(set(names)) != len(names):
            raise ValueError(f"grid: two points have the same name {names}; give each model a `name`")
        return points


MODEL_ABBREVIATIONS = {"d_model": "d", "n_layers": "l", "n_heads": "h", "d_ff": "ff", "preset": ""}


def point_name(model: dict[str, Any] | None, budget: str | int | None, lr: float | None = None) -> str:
    """A grid point's directory name: ``d256-l8-lr2e-3-2.5M`` (or the model's own ``name``)."""
    parts = []
    if model:
        parts.append(
            str(model["name"])
            if "name" in model
            else "-".join(f"{MODEL_ABBREVIATIONS.get(k, k)}{v}" for k, v in model.items())
        )
    if lr is not None:
        parts.append(f"lr{rate_name(lr)}")
    if budget is not None:
        parts.append(str(budget).replace(" ", ""))
    return "-".join(parts).replace("/", "_")


def rate_name(lr: float) -> str:
    """``2e-3`` for 0.002, ``1.5e-3`` for 0.0015: short, exact for the rates a grid lists."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@dataclass
class LaunchSpec:
    """``nproc_per_node: 0`` trains in this process; N >= 1 runs each training as
    ``torchrun --nproc_per_node N [torchrun_args] -m tablefree.cli train --config ... --run-dir ... --resume``.
    ``backend: slurm`` runs every run as one task of a SLURM job array instead (``tablefree.launch``)."""

    backend: str = "local"  # local | slurm
    nproc_per_node: int = 0
    torchrun_args: list[str] = field(
        default_factory=list
    )  # e.g. ["--nnodes", "2", "--rdzv-endpoint", "host:29500"]
    slurm: SlurmSpec = field(default_factory=SlurmSpec)

    def __post_init__(self) -> None:
        if self.backend not in ("local", "slurm"):
            raise ValueError(f"launch.backend: expected local or slurm, got {self.backend!r}")
        if self.backend == "slurm" and self.slurm.nodes > 1 and self.nproc_per_node < 1:
            raise ValueError(
                "launch.slurm.nodes > 1 needs launch.nproc_per_node >= 1 (one torchrun per node)"
            )


@dataclass
class CompareConfig:
    name: str = "compare"
    train_config: str | None = None  # a train recipe YAML (configs/small.yaml); `train` is merged over it
    train: dict[str, Any] = field(default_factory=dict)  # inline recipe / overrides, as in a train YAML
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    interfaces: list[str] = field(default_factory=lambda: ["learned", "canonical", "affine"])
    # Interfaces every other one is compared with; empty: every pair. With many interfaces (an ablation),
    # comparing with the controls only keeps Holm's family to the questions asked.
    baselines: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    eval: EvalSpec = field(default_factory=EvalSpec)
    grid: GridSpec = field(default_factory=GridSpec)
    # Recipe overrides for one interface only, e.g. {canonical: {optim: {lr: 4e-3}}}: each interface at the rate
    # a learning-rate check chose for it. The report says which runs used them.
    interface_train: dict[str, dict[str, Any]] = field(default_factory=dict)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    out: str = ""  # empty: runs/{name}
    bootstrap: int = 10_000  # paired-bootstrap replicates in the report
    notes: list[str] = field(default_factory=list)  # shown at the top of the report (markdown)
    config_file: str = (
        ""  # the YAML the config was read from (load_compare_config sets it; the report's title)
    )
    analysis: bool = False  # run `tablefree analyze` on every finished run; its section joins the report
    # token budgets at which the report's fitted curves predict each gap, e.g. [17B, 100B] (the papers'); every
    # prediction says how far beyond the largest budget run it reaches and whether the backtest held
    predict_at: list[str | int] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [i for i in self.interfaces if i not in INTERFACES]
        if unknown or not self.interfaces:
            raise ValueError(f"interfaces: expected some of {sorted(INTERFACES)}, got {self.interfaces}")
        # Checked against the registry, not this run's interfaces: a sweep grows by interfaces over several
        # invocations (`--interfaces gaussian` adds one), and the report keeps the baselines that have runs.
        unknown = [i for i in self.baselines if i not in INTERFACES]
        if unknown or len(set(self.baselines)) != len(self.baselines):
            raise ValueError(
                f"baselines: expected distinct names from {sorted(INTERFACES)}, got {self.baselines}"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds: expected distinct non-negative integers, got {self.seeds}")
        parse_token_budgets(self.predict_at, "predict_at")
        unknown = [name for name in self.interface_train if name not in INTERFACES]
        if unknown or not all(isinstance(v, dict) for v in self.interface_train.values()):
            raise ValueError(
                f"interface_train: expected {{interface: recipe overrides}} with names from {sorted(INTERFACES)}, "
                f"got {self.interface_train}"
            )
        if self.grid.lr and any("lr" in (v.get("optim") or {}) for v in self.interface_train.values()):
            raise ValueError("interface_train sets optim.lr and grid.lr lists rates: choose one of the two")
        if self.launch.nproc_per_node < 0:
            raise ValueError("launch.nproc_per_node: must be >= 0")
        if self.bootstrap < 100:
            raise ValueError(f"bootstrap: use at least 100 replicates, got {self.bootstrap}")
        self.grid.points()  # names must be distinct

    @property
    def out_dir(self) -> Path:
        return Path(self.out or f"runs/{self.name}")


def load_compare_config(
    path: str | Path,
    interfaces: list[str] | None = None,
    seeds: list[int] | None = None,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
) -> CompareConfig:
    """A CompareConfig from YAML, with dotted ``overrides`` (``eval.limit=null``, ``train.budget=1M``) and the
    command line's interface, seed and output choices applied."""
    data = load_yaml(path)
    data.setdefault("name", Path(path).stem)
    options = {"interfaces": interfaces, "seeds": seeds, "out": None if out is None else str(out)}
    options = {key: value for key, value in options.items() if value is not None}
    config = from_dict_with_overrides(CompareConfig, data, overrides or [], str(path), options)
    config.config_file = str(path)
    named = {item.split("=", 1)[0].strip() for item in overrides or []}
    if named & {"dataset.dir", "dataset"} and not named & {"dataset.corpus", "dataset"}:
        # The config's corpus and its preparation settings belong to the config's directory: a directory named
        # on the command line must hold a prepared dataset already, or the same command names the corpus.
        defaults = DatasetSpec()
        for key in to_dict(defaults):
            if key != "dir" and f"dataset.{key}" not in named:
                setattr(config.dataset, key, getattr(defaults, key))
    if "train.data.dir" in named and config.dataset.dir and not named & {"dataset.dir", "dataset"}:
        raise ValueError(
            f"command-line override train.data.dir: {path} sets dataset.dir={config.dataset.dir}, which the "
            "runs train on; name your dataset with dataset.dir=DIR instead"
        )
    if config.train_config:
        config.train_config = str(
            _find_relative(config.train_config, Path(path).parent, f"{path}: train_config")
        )
    return config


def _find_relative(name: str, base: Path, where: str) -> Path:
    """``name`` as given (relative to the working directory), else relative to ``base``."""
    for candidate in (Path(name), base / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{where}: {name} not found (relative to {Path.cwd()} or {base})")


# ------------------------------------------------------------------------------------------------------------
# Per-run configs


def base_recipe(config: CompareConfig) -> dict[str, Any]:
    """The shared training recipe as a train-config dict: ``train_config`` with ``train`` merged over it."""
    recipe = load_yaml(config.train_config) if config.train_config else {}
    recipe = deep_merge(recipe, config.train)
    if config.dataset.dir:
        recipe.setdefault("data", {})["dir"] = config.dataset.dir
    if not (recipe.get("data") or {}).get("dir"):
        raise ValueError(
            f"compare config {config.name}: no dataset; set dataset.dir (or data.dir in the recipe)"
        )
    return recipe


def run_recipe(recipe: dict[str, Any], interface: str, seed: int) -> dict[str, Any]:
    """The recipe of one run: the base recipe with only the interface name and the seed changed."""
    run = copy.deepcopy(recipe)
    model = run.setdefault("model", {})
    spec = model.get("interface")
    spec = {"name": spec} if isinstance(spec, str) else dict(spec or {})
    spec["name"] = interface
    model["interface"] = spec
    run["seed"] = seed
    return run


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# ------------------------------------------------------------------------------------------------------------
# The sweep


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
    recipe: dict[str, Any]
    point: str = ""
    branch: Branch | None = None

    @property
    def name(self) -> str:
        return run_name(self.interface, self.seed, self.point)


def plan_runs(config: CompareConfig) -> list[RunPlan]:
    """Every run of the sweep (grid point, interface, seed), each recipe checked as a training config."""
    from tablefree.train.recipe import TrainConfig

    recipe = base_recipe(config)
    plans = []
    # Seeds outer, interfaces inner: a sweep stopped early still holds complete seed-paired sets.
    for point in config.grid.points() or [{"name": "", "train": {}}]:
        point_recipe = deep_merge(recipe, point["train"])
        for seed in config.seeds:
            for interface in point.get("interfaces") or config.interfaces:
                if interface not in config.interfaces:
                    continue
                run = run_recipe(
                    deep_merge(point_recipe, config.interface_train.get(interface, {})), interface, seed
                )
                name = run_name(interface, seed, point["name"])
                from_dict(TrainConfig, run, where=f"recipe of {name}")  # fail early, by name
                directory = run_directory(config.out_dir, interface, seed, point["name"])
                plans.append(RunPlan(interface, seed, directory, run, point["name"]))
    return branch_budgets(plans) if config.grid.branch else plans


def branch_budgets(plans: list[RunPlan]) -> list[RunPlan]:
    """Budget branching: in each group of runs that differ only in their budget, the largest budget is the trunk
    and keeps a checkpoint at every other budget's decay start; the others start there. Ordered trunk first,
    then its branches (shortest first), group by group in the sweep's order."""
    from tablefree.train.recipe import TrainConfig, budget_steps, decay_start, lr_at

    groups: dict[str, list[RunPlan]] = {}
    for run in plans:
        key = yaml.safe_dump({k: v for k, v in run.recipe.items() if k not in BRANCH_FIELDS}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    ordered = []
    for group in groups.values():
        configs = {
            run.name: from_dict(TrainConfig, run.recipe, where=f"recipe of {run.name}") for run in group
        }
        steps = {
            run.name: budget_steps(configs[run.name].budget, configs[run.name].batch_tokens) for run in group
        }
        group.sort(key=lambda run: steps[run.name])
        trunk, branches = group[-1], group[:-1]
        schedule = configs[trunk.name].schedule
        if schedule.name != "wsd":
            raise ValueError(
                f"grid.branch: {trunk.name} uses schedule.name={schedule.name!r}; budgets branch only from the "
                "stable phase of a wsd schedule (set schedule.name: wsd)"
            )
        if not isinstance(configs[trunk.name].compile, bool):
            raise ValueError(
                f"grid.branch: {trunk.name} has compile: {configs[trunk.name].compile!r}; set compile: true or "
                "false, since `auto` decides per budget (a long trunk compiles, a short budget would not) and a "
                "branch would then not compute what its budget trained from scratch computes"
            )
        if configs[trunk.name].precision == "auto":
            raise ValueError(
                f"grid.branch: {trunk.name} has precision: auto; set precision: fp32 or bf16, since `auto` is "
                "decided by each run from the measured matmul rates, which can differ between a trunk and a branch "
                "trained later"
            )
        points = []
        for run in branches:
            start = decay_start(steps[run.name], schedule)
            peak = configs[run.name].optim.lr
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
        trunk.recipe["checkpoint_steps"] = sorted(points)
        ordered += [trunk, *branches]
    return ordered


# the fields in which the runs of one branching group differ
BRANCH_FIELDS = ("budget", "checkpoint_steps")


def check_sweep(config: CompareConfig, plans: list[RunPlan]) -> None:
    """Everything knowable before training, for every run: its recipe builds a model (interface options
    included) on the dataset's vocabulary, its step plan holds (batch, budget, warmup), and the evaluation's
    tasks and files exist."""
    from tablefree.data.loader import read_manifest
    from tablefree.params import param_breakdown
    from tablefree.train.recipe import TrainConfig
    from tablefree.train.recipe import plan as step_plan

    check_eval_data(config)
    vocab = None
    for plan in plans:
        train_config = from_dict(TrainConfig, plan.recipe, where=f"recipe of {plan.name}")
        if vocab is None and (Path(train_config.data.dir) / "manifest.json").exists():
            vocab = read_manifest(train_config.data.dir).get("vocab_size")
        try:
            model_config = train_config.model.build(vocab)
            param_breakdown(model_config)  # builds the model on the meta device
            step_plan(train_config, model_config, max(1, config.launch.nproc_per_node))  # steps, warmup
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"recipe of {plan.name}: {error}") from error


def run_state(run: RunPlan, spec: EvalSpec) -> str:
    """``done`` (trained, and evaluated on every task with the same limit), ``trained`` or ``todo``."""
    summary = read_json(run.directory / RUN_FILES["summary"], default=None)
    if not (summary and summary.get("completed")):
        return "todo"
    results = read_json(run.directory / RUN_FILES["eval"], default=None) or {}
    evaluated = set(results.get("tasks", {}))
    limits = (results.get("limit"), results.get("val_limit"))
    current = set(spec.tasks) <= evaluated and limits == (spec.limit, spec.val_limit)
    # validation results from before per-document losses existed: evaluate again (the report's bootstrap)
    tasks = results.get("tasks", {})  # none yet: trained, not evaluated
    # and from before coverage was recorded (the last short window was dropped then)
    per_document = "validation" not in spec.tasks or {"per_document", "coverage"} <= set(
        tasks.get("validation", {})
    )
    examples = (run.directory / RUN_FILES["examples"]).exists()
    selection = (
        not (run.recipe.get("data") or {}).get("select_every")
        or (run.directory / RUN_FILES["selection"]).exists()
    )
    return "done" if current and per_document and examples and selection else "trained"


def run_sweep(config: CompareConfig, report: bool = True, log=print) -> dict[str, Any]:
    """Train, evaluate and report every (interface, seed) run of ``config``; returns the sweep outcome
    (``{"out": dir, "runs": {name: state}, "report": report dict or None}``)."""
    out = config.out_dir
    plans = plan_runs(config)
    check_eval_data(config)  # before a long data preparation
    prepare_data(config, log)
    check_sweep(config, plans)
    out.mkdir(parents=True, exist_ok=True)
    write_sweep_config(config, out)
    if config.launch.backend == "slurm":
        return submit_sweep(config, plans, log)
    outcome: dict[str, str] = {}
    took: list[float] = []  # seconds per run this invocation trained or evaluated, for the sweep's ETA
    for number, run in enumerate(plans, start=1):
        prefix = f"[run {number}/{len(plans)}] {run.name}"
        state = run_state(run, config.eval)
        if state == "done":
            log(f"{prefix}: finished earlier, skipped")
            outcome[run.name] = "done"
            continue
        started = time.perf_counter()
        outcome[run.name] = execute_run(config, run, state, prefix, log)
        took.append(time.perf_counter() - started)
        left = [p for p in plans[number:] if run_state(p, config.eval) != "done"]
        if left:
            log(f"sweep: {len(left)} run(s) to go, about {_duration(len(left) * sum(took) / len(took))} more")
    failed = [name for name, state in outcome.items() if state == "failed"]
    result: dict[str, Any] = {"out": str(out), "runs": outcome, "failed": failed, "report": None}
    if config.analysis:  # each finished run against the learned run of its seed (docs/analysis.md)
        from tablefree.analysis.sweep import analyze_runs

        done = {name for name, state in outcome.items() if state == "done"}
        result["analysis"] = analyze_runs(plans, done, device=config.eval.device, log=log)
    if report:
        from tablefree.report import build_report

        log(f"writing the report in {out}")
        result["report"] = build_report(out, n_boot=config.bootstrap)
    return result


def execute_run(config: CompareConfig, run: RunPlan, state: str, prefix: str, log) -> str:
    """Train (unless trained) and evaluate one run; a failure is recorded, not raised (KeyboardInterrupt is)."""
    run.directory.mkdir(parents=True, exist_ok=True)
    status = read_json(run.directory / RUN_FILES["status"], default=None) or {}
    status.update(state="running", started=_now(), error=None)
    write_json_atomic(run.directory / RUN_FILES["status"], status)
    (run.directory / RUN_FILES["error"]).unlink(missing_ok=True)
    try:
        if state != "trained":
            if run.branch is not None and start_branch(run):
                log(f"{prefix}: branched from {run.branch.trunk} at step {run.branch.step}")
            log(f"{prefix}: training")
            started = time.perf_counter()
            train_run(config, run)
            status["train_call_s"] = time.perf_counter() - started
        log(f"{prefix}: evaluating {', '.join(config.eval.tasks)}")
        started = time.perf_counter()
        evaluate_run(config, run)
        status.update(state="done", eval_wall_s=time.perf_counter() - started, finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        log(f"{prefix}: done")
        return "done"
    except KeyboardInterrupt:
        status.update(state="interrupted", finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        raise
    except Exception as error:  # a failed run must not sink the sweep
        message = f"{type(error).__name__}: {error}"
        write_text_atomic(run.directory / RUN_FILES["error"], traceback.format_exc())
        status.update(state="failed", error=message, finished=_now())
        write_json_atomic(run.directory / RUN_FILES["status"], status)
        log(f"{prefix}: FAILED ({message}); traceback in {run.directory / RUN_FILES['error']}")
        return "failed"


def start_branch(run: RunPlan) -> bool:
    """Seed a branch's run directory with its trunk's checkpoint at the branch step (hard links where the
    filesystem allows: checkpoints are never written again) and the trunk's metrics up to it; the trainer then
    resumes there with the branch's own recipe. False when the branch has a checkpoint of its own already, or
    when its trunk finished without this branch point (a budget added later): it then trains from scratch."""
    from tablefree.checkpoint import layout

    assert run.branch is not None
    if layout.complete_checkpoints(run.directory):
        return False
    source = run.branch.directory / layout.CHECKPOINTS_DIR / layout.step_dir_name(run.branch.step)
    trunk_summary = read_json(run.branch.directory / RUN_FILES["summary"], default=None) or {}
    if not layout.is_complete(source) and trunk_summary.get("completed"):
        # the trunk finished before this budget joined the grid, so it kept no checkpoint here: the branch is
        # the same run as training from scratch, which is what happens
        return False
    if not layout.is_complete(source):
        raise RuntimeError(
            f"{run.name} starts from {run.branch.trunk}'s checkpoint at step {run.branch.step}, and {source} "
            "is not a complete checkpoint: the trunk run must finish first (re-run the sweep; it trains trunks "
            "before their branches)"
        )
    root = run.directory / layout.CHECKPOINTS_DIR
    staging = root / f".{source.name}.branch"
    shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while copying
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, staging, copy_function=_link_or_copy)
    metrics = run.branch.directory / RUN_FILES["metrics"]
    if metrics.exists():  # the trainer cuts it back to the branch step
        shutil.copyfile(metrics, run.directory / RUN_FILES["metrics"])
    write_json_atomic(
        run.directory / RUN_FILES["branch"],
        {
            "trunk": run.branch.trunk,
            "trunk_dir": os.path.relpath(run.branch.directory, run.directory),
            "step": run.branch.step,
            "checkpoint_sha256": read_json(source / layout.COMPLETE_MARKER).get("sha256"),
            "created": _now(),
        },
    )
    staging.rename(root / source.name)
    return True


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


# ------------------------------------------------------------------------------------------------------------
# On a SLURM cluster: each run is one array task calling run_job (tablefree.launch submits and requeues)


def jobs_folder(config: CompareConfig) -> Path:
    return Path(config.launch.slurm.folder or config.out_dir / "slurm")


def sweep_status(config: CompareConfig, plans: list[RunPlan]) -> dict[str, dict[str, str]]:
    """{run name: {"state": from the run directory, "job": id, "queue": the scheduler's state}}; ``state``
    is ``done``, ``trained``, ``todo`` or the status file's ``failed``/``interrupted``/``running``."""
    from tablefree import launch

    jobs = launch.recorded_jobs(jobs_folder(config))
    queue = launch.queue_states(config.launch.slurm) if jobs else {}
    status = {}
    for run in plans:
        state = run_state(run, config.eval)
        recorded = (read_json(run.directory / RUN_FILES["status"], default=None) or {}).get("state")
        if state != "done" and recorded in ("failed", "interrupted", "running"):
            state = recorded
        job = jobs.get(run.name, "")
        status[run.name] = {"state": state, "job": job, "queue": queue.get(job, "")}
    return status


def submit_sweep(config: CompareConfig, plans: list[RunPlan], log=print) -> dict[str, Any]:
    """Submit every run that is neither done nor queued as one SLURM job array, and return at once."""
    from tablefree import launch

    status = sweep_status(config, plans)
    runs: dict[str, str] = {}
    tasks = {}
    for run in plans:
        current = status[run.name]
        if current["state"] == "done":
            runs[run.name] = "done"
        elif current["queue"] in launch.ACTIVE_STATES:
            runs[run.name] = f"queued ({current['queue']}, job {current['job']})"
        elif run.branch is not None and status[run.branch.trunk]["state"] not in ("done", "trained"):
            # a budget branch starts from its trunk's checkpoint: submitted by the next `compare` after it
            runs[run.name] = f"waits for {run.branch.trunk} (re-run this command once it has finished)"
        else:
            tasks[run.name] = functools.partial(run_job, config, run)
    folder = jobs_folder(config)
    jobs = launch.submit(config.launch.slurm, folder, config.name, tasks, log)
    runs.update({name: f"submitted (job {job})" for name, job in jobs.items()})
    for name, state in runs.items():
        log(f"{name}: {state}")
    log(
        f"`tablefree compare --config ... --status` shows each run; `tablefree report {config.out_dir}` at the end"
    )
    if config.analysis:
        log("note: analysis: true is not run on the cluster; run `tablefree analyze` on the finished runs")
    return {"out": str(config.out_dir), "runs": runs, "failed": [], "report": None, "jobs": jobs}


def run_job(config: CompareConfig, run: RunPlan) -> str:
    """One run as one cluster task, the same on every node of the job: ``execute_run`` on the first node
    (train, evaluate, status), the training alone on the others (their torchrun joins the first's).
    Raises ``launch.Preempted`` when the training stopped on the preemption signal after saving."""
    from tablefree import launch

    if config.launch.nproc_per_node >= 1:
        rendezvous = launch.rendezvous_args(config.launch.slurm.nodes, config.launch.slurm.port)
        config = copy.deepcopy(config)
        config.launch.torchrun_args = [*rendezvous, *config.launch.torchrun_args]
        signals = launch.preemption_signal_for_children()
    else:
        signals = contextlib.nullcontext()
    prefix = f"{run.name} (node {launch.node_rank()})"
    try:
        with signals:
            if launch.node_rank() != 0:
                train_run(config, run)
                return "trained"
            state = run_state(run, config.eval)
            return "done" if state == "done" else execute_run(config, run, state, prefix, print)
    except KeyboardInterrupt:
        reason = str(
            (read_json(run.directory / RUN_FILES["summary"], default=None) or {}).get("stop_reason", "")
        )
        if reason in (f"stopped by {launch.PREEMPT_SIGNAL.name}", "stopped by a signal on another process"):
            raise launch.Preempted(f"{run.name}: {reason}") from None
        raise


def emit_sbatch(config: CompareConfig, path: Path, log=print) -> list[RunPlan]:
    """Write the sweep as a plain sbatch array script, one line per run (``tablefree compare --only RUN``);
    finished runs are left out."""
    from tablefree import launch

    check_eval_data(config)
    prepare_data(config, log)
    plans = [run for run in plan_runs(config) if run_state(run, config.eval) != "done"]
    if not plans:
        raise ValueError(f"every run of {config.out_dir} is done: nothing to write to {path}")
    check_sweep(config, plans)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    write_sweep_config(config, config.out_dir)
    # The config as resolved here (command-line overrides included), for the tasks to load.
    resolved = jobs_folder(config) / "sweep.yaml"
    resolved.parent.mkdir(parents=True, exist_ok=True)
    _write_yaml_atomic(
        resolved, {**to_dict(config), "launch": {**to_dict(config.launch), "backend": "local"}}
    )
    python = launch.python_command(config.launch.slurm)
    base = f"{python} -m tablefree.cli compare --config {shlex.quote(str(resolved))} --no-report --only"
    commands = [f"{base} {shlex.quote(run.name)}" for run in plans]
    script = launch.sbatch_script(config.launch.slurm, config.name, jobs_folder(config), commands)
    launch.write_sbatch(path, script)
    log(f"wrote {path}: {len(plans)} runs; submit with `sbatch {path}` (logs in {jobs_folder(config)})")
    return plans


def train_run(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    """Train (or resume) one run, in this process or under torchrun; returns its summary."""
    if config.launch.nproc_per_node >= 1:
        summary = _train_with_torchrun(config, run)
    else:
        from tablefree.train import trainer
        from tablefree.train.recipe import TrainConfig

        train_config = from_dict(TrainConfig, run.recipe, where=f"recipe of {run.name}")
        summary = trainer.train(train_config, run.directory, resume="auto")
    if not summary.get("completed"):
        reason = summary.get("stop_reason", "unknown")
        if str(reason).startswith("stopped by"):  # SIGINT/SIGTERM: the user stops the sweep
            raise KeyboardInterrupt(reason)
        raise RuntimeError(f"training did not complete: {reason}")
    return summary


def _train_with_torchrun(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    recipe_path = run.directory / "recipe.yaml"
    _write_yaml_atomic(recipe_path, run.recipe)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={config.launch.nproc_per_node}",
        *config.launch.torchrun_args,
        "-m",
        "tablefree.cli",
        "train",
        "--config",
        str(recipe_path),
        "--run-dir",
        str(run.directory),
        "--resume-if-present",
    ]
    log_path = run.directory / "train.log"
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(command)}\n")
        log_file.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:  # tee: the user sees progress, the run keeps the log
            sys.stdout.write(line)
            log_file.write(line)
        code = process.wait()
    summary = read_json(run.directory / RUN_FILES["summary"], default=None)
    if code != 0 and not (summary and str(summary.get("stop_reason", "")).startswith("stopped by")):
        raise RuntimeError(f"torchrun exited with status {code}; see {log_path}")
    if summary is None:
        raise RuntimeError(f"torchrun wrote no summary.json; see {log_path}")
    return summary


def evaluate_run(config: CompareConfig, run: RunPlan) -> dict[str, Any]:
    """Evaluate a trained run with ``tablefree.evaluate.run_eval`` (validation and benchmarks have their own
    limits); writes ``eval.json`` and the benchmarks' per-example records, which feed the paired bootstrap."""
    from tablefree.evaluate import run_eval

    spec = config.eval
    common = dict(
        data_dir=spec.data_dir,
        batch_size=spec.batch_size,
        device=spec.device,  # load_model resolves "auto"
        dtype=spec.dtype,
        val_data=run.recipe["data"]["dir"],
        progress=sys.stderr.isatty(),
    )
    benchmarks = [task for task in spec.tasks if task != "validation"]
    results: dict[str, Any] = {"tasks": {}}
    if "validation" in spec.tasks:
        results = run_eval(run.directory, ["validation"], limit=spec.val_limit, **common)
    if benchmarks:
        scored = run_eval(
            run.directory,
            benchmarks,
            limit=spec.limit,
            examples_out=run.directory / RUN_FILES["examples"],
            **common,
        )
        results = {**scored, "tasks": {**results["tasks"], **scored["tasks"]}}
    else:
        write_text_atomic(run.directory / RUN_FILES["examples"], "")
    results.update(limit=spec.limit, val_limit=spec.val_limit)
    select_every = (run.recipe.get("data") or {}).get("select_every") or 0
    if select_every:
        write_json_atomic(run.directory / RUN_FILES["selection"], score_selection(run, select_every, spec))
    write_json_atomic(run.directory / RUN_FILES["eval"], results)
    return results


def score_selection(run: RunPlan, select_every: int, spec: EvalSpec) -> dict[str, Any]:
    """The run's final model on the training windows it held out (``data.select_every``)."""
    from tablefree.checkpoint.model_dir import load_model
    from tablefree.evaluate.selection import selection_metrics

    model, checkpoint = load_model(run.directory, device=spec.device)
    model.eval()
    result = selection_metrics(
        model, run.recipe["data"]["dir"], model.config.max_seq_len, select_every, spec.batch_size
    )
    return {**result, "checkpoint": os.path.relpath(checkpoint, run.directory)}


def prepare_data(config: CompareConfig, log=print) -> None:
    """Prepare ``dataset.corpus`` into ``dataset.dir`` unless that holds a complete dataset already, in which case
    the dataset must be the one the config names (its corpus and vocabulary): a sweep never trains on a corpus
    other than the one it records."""
    spec = config.dataset
    if not spec.dir:
        return
    if (Path(spec.dir) / "manifest.json").exists():
        check_prepared_dataset(config)
        return
    if not spec.corpus:
        raise FileNotFoundError(
            f"dataset.dir {spec.dir} holds no prepared dataset (no manifest.json): prepare one with "
            f"`tablefree data prepare CORPUS --out {spec.dir}`, or name the corpus in the same command "
            f"(dataset.corpus=CORPUS) to have compare prepare it"
        )
    from tablefree.data.prepare import prepare_dataset

    chosen = {
        "vocab_size": spec.vocab_size,
        "val_fraction": spec.val_fraction,
        "val_documents": spec.val_documents,
        "val_section_chars": spec.val_section_chars,
    }
    log(f"preparing {spec.corpus} into {spec.dir}")
    prepare_dataset(
        spec.corpus,
        spec.dir,
        tokenizer=spec.tokenizer,
        workers=spec.workers,
        text_field=spec.text_field,
        gutenberg=spec.gutenberg,
        **{k: v for k, v in chosen.items() if v is not None},
    )


def check_prepared_dataset(config: CompareConfig) -> None:
    """A prepared ``dataset.dir`` must come from ``dataset.corpus`` and have ``dataset.vocab_size`` when those are
    set (a local corpus: the manifest records its resolved paths)."""
    from tablefree.data.loader import read_manifest

    spec = config.dataset
    manifest = read_manifest(spec.dir)
    paths = (manifest.get("corpus") or {}).get("paths")
    if spec.corpus and paths is not None and str(Path(spec.corpus).resolve()) not in paths:
        raise ValueError(
            f"dataset.dir {spec.dir} was prepared from {', '.join(paths)}, not dataset.corpus {spec.corpus}; "
            f"point dataset.dir at a new directory to prepare {spec.corpus} there, or drop dataset.corpus"
        )
    if spec.vocab_size is not None and manifest.get("vocab_size") not in (None, spec.vocab_size):
        raise ValueError(
            f"dataset.dir {spec.dir} has a vocabulary of {manifest['vocab_size']}, dataset.vocab_size says "
            f"{spec.vocab_size}; point dataset.dir at a new directory or set dataset.vocab_size={manifest['vocab_size']}"
        )


def check_eval_data(config: CompareConfig) -> None:
    """Fail before any training when a requested benchmark's files are missing: one error listing every missing
    file, the command that fetches them and compare's own setting for where they are (``eval.data_dir``)."""
    from tablefree.evaluate import get_task
    from tablefree.evaluate.tasks import check_task_files

    tasks = [get_task(name) for name in config.eval.tasks if name != "validation"]
    try:
        check_task_files(tasks, config.eval.data_dir, point_at="eval.data_dir=DIR (command line or config)")
    except FileNotFoundError as error:
        raise FileNotFoundError(f"eval.tasks: {error}; or leave those tasks out of eval.tasks") from None


def write_sweep_config(config: CompareConfig, out: Path) -> None:
    """Record the sweep's config; refuse an output directory that holds a sweep with another recipe."""
    path = out / SWEEP_CONFIG
    data = to_dict(config)
    data["dataset"] = dataset_as_used(config)
    data["resolved_recipe"] = base_recipe(config)
    data["grid_points"] = config.grid.points()
    if path.exists():
        previous = load_yaml(path)
        if "resolved_recipe" in previous and previous["resolved_recipe"] != data["resolved_recipe"]:
            raise ValueError(
                f"{out} holds a sweep with a different training recipe (see resolved_recipe in {path}); runs "
                "from two recipes must not be mixed: use another --out"
            )
        data["interfaces"] = _union(previous.get("interfaces", []), config.interfaces)
        data["seeds"] = _union(previous.get("seeds", []), config.seeds)
        data["grid_points"] = _union_points(previous.get("grid_points") or [], data["grid_points"], path)
    _write_yaml_atomic(path, data)


def dataset_as_used(config: CompareConfig) -> dict[str, Any]:
    """The dataset as the runs use it, from its manifest: directory, sources, tokenizer hash, vocabulary, and
    per split its tokens, documents and shard sha256s; the preparation settings only when the sweep prepared
    it (``prepared_by_sweep``), never an unused default."""
    from tablefree.data.loader import read_manifest

    directory = config.dataset.dir or base_recipe(config)["data"]["dir"]
    if not (Path(directory) / "manifest.json").exists():
        return {"dir": directory}  # not prepared yet: nothing is known about it
    manifest = read_manifest(directory)
    used: dict[str, Any] = {
        "dir": directory,
        "sources": [_source_name(source) for source in manifest.get("sources") or []],
        "corpus": [os.path.relpath(path) for path in (manifest.get("corpus") or {}).get("paths") or []]
        or None,
        "tokenizer_hash": manifest.get("tokenizer_hash"),
        "vocab_size": manifest.get("vocab_size"),
        "created": manifest.get("created"),
        "splits": {
            split: {
                "tokens": info.get("tokens"),
                "documents": info.get("documents"),
                "sha256": {shard["file"]: shard.get("sha256") for shard in info["shards"]},
            }
            for split, info in manifest["splits"].items()
        },
    }
    if config.dataset.corpus:
        spec = {k: v for k, v in to_dict(config.dataset).items() if v not in (None, "", False)}
        used["prepared_by_sweep"] = {k: v for k, v in spec.items() if k != "dir"}
    return used


def _source_name(source: Any) -> Any:
    """A manifest's source entry, short: a local file's name, sha256 and documents, or the hub/adopted record."""
    if isinstance(source, dict) and "file" in source and "sha256" in source:
        return {k: source[k] for k in ("file", "sha256", "documents") if k in source}
    return source


def _union(first: list, second: list) -> list:
    return list(dict.fromkeys([*first, *second]))


def _union_points(first: list[dict], second: list[dict], path: Path) -> list[dict]:
    """Grid points of an earlier run of the sweep and of this one, in this config's order (then the earlier
    run's other points), so a budget added below the others is listed first, not last; a name may not change
    its settings."""
    merged = {p["name"]: dict(p) for p in first}
    for point in second:
        earlier = merged.get(point["name"])
        if earlier is not None and earlier["train"] != point["train"]:
            raise ValueError(
                f"grid point {point['name']} had other settings in {path} ({earlier['train']}); "
                "runs from two recipes must not be mixed: use another --out"
            )
        if earlier is None:
            merged[point["name"]] = dict(point)
        elif "interfaces" not in point:  # trained for every interface now
            earlier.pop("interfaces", None)
        elif "interfaces" in earlier:  # a rate listed for more interfaces later
            earlier["interfaces"] = _union(earlier["interfaces"], point["interfaces"])
    order = _union([p["name"] for p in second], [p["name"] for p in first])
    return [merged[name] for name in order]


def _write_yaml_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2.5 h``: an estimate's precision."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
