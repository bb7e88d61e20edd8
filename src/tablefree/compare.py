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
"""

from __future__ import annotations

import copy
import datetime
import itertools
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tablefree.config_parsing import from_dict, from_dict_with_overrides, load_yaml, to_dict
from tablefree.fileio import write_json_atomic, write_text_atomic
from tablefree.interfaces import INTERFACES
from tablefree.rundir import RUN_FILES, SWEEP_CONFIG, read_json, run_directory, run_name


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


@dataclass
class GridSpec:
    """Several budgets and/or model sizes under one recipe: every combination is a grid point, and every grid
    point trains every (interface, seed). Empty lists: the recipe's own budget and model."""

    budget: list[str | int] = field(default_factory=list)  # e.g. [500k, 1M, 2.5M]
    model: list[dict[str, Any]] = field(default_factory=list)  # e.g. [{d_model: 128, n_layers: 4}, ...]

    def points(self) -> list[dict[str, Any]]:
        """[{"name", "train": overrides}] in order (models outer, budgets inner); [] without a grid."""
        if not self.budget and not self.model:
            return []
        points = []
        for model, budget in itertools.product(self.model or [None], self.budget or [None]):
            overrides: dict[str, Any] = {}
            if model is not None:
                overrides["model"] = {k: v for k, v in model.items() if k != "name"}
            if budget is not None:
                overrides["budget"] = budget
            points.append({"name": point_name(model, budget), "train": overrides})
        names = [p["name"] for p in points]
        if len(set(names)) != len(names):
            raise ValueError(f"grid: two points have the same name {names}; give each model a `name`")
        return points


MODEL_ABBREVIATIONS = {"d_model": "d", "n_layers": "l", "n_heads": "h", "d_ff": "ff", "preset": ""}


def point_name(model: dict[str, Any] | None, budget: str | int | None) -> str:
    """A grid point's directory name: ``d256-l8-2.5M`` (or the model's own ``name``)."""
    parts = []
    if model:
        parts.append(
            str(model["name"])
            if "name" in model
            else "-".join(f"{MODEL_ABBREVIATIONS.get(k, k)}{v}" for k, v in model.items())
        )
    if budget is not None:
        parts.append(str(budget).replace(" ", ""))
    return "-".join(parts).replace("/", "_")


@dataclass
class LaunchSpec:
    """``nproc_per_node: 0`` trains in this process; N >= 1 runs each training as
    ``torchrun --nproc_per_node N [torchrun_args] -m tablefree.cli train --config ... --run-dir ... --resume``."""

    nproc_per_node: int = 0
    torchrun_args: list[str] = field(
        default_factory=list
    )  # e.g. ["--nnodes", "2", "--rdzv-endpoint", "host:29500"]


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
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    out: str = ""  # empty: runs/{name}
    bootstrap: int = 10_000  # paired-bootstrap replicates in the report
    notes: list[str] = field(default_factory=list)  # shown at the top of the report (markdown)
    config_file: str = (
        ""  # the YAML the config was read from (load_compare_config sets it; the report's title)
    )
    analysis: bool = False  # run `tablefree analyze` on every finished run; its section joins the report

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
class RunPlan:
    interface: str
    seed: int
    directory: Path
    recipe: dict[str, Any]
    point: str = ""

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
            for interface in config.interfaces:
                run = run_recipe(point_recipe, interface, seed)
                name = run_name(interface, seed, point["name"])
                from_dict(TrainConfig, run, where=f"recipe of {name}")  # fail early, by name
                directory = run_directory(config.out_dir, interface, seed, point["name"])
                plans.append(RunPlan(interface, seed, directory, run, point["name"]))
    return plans


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
    summary = read_json(run.directory / RUN_FILES["summary"])
    if not (summary and summary.get("completed")):
        return "todo"
    results = read_json(run.directory / RUN_FILES["eval"]) or {}
    evaluated = set(results.get("tasks", {}))
    limits = (results.get("limit"), results.get("val_limit"))
    current = set(spec.tasks) <= evaluated and limits == (spec.limit, spec.val_limit)
    # validation results from before per-document losses existed: evaluate again (the report's bootstrap)
    # and from before coverage was recorded (the last short window was dropped then)
    per_document = "validation" not in spec.tasks or {"per_document", "coverage"} <= set(
        results["tasks"].get("validation", {})
    )
    examples = (run.directory / RUN_FILES["examples"]).exists()
    return "done" if current and per_document and examples else "trained"


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
    status = read_json(run.directory / RUN_FILES["status"]) or {}
    status.update(state="running", started=_now(), error=None)
    write_json_atomic(run.directory / RUN_FILES["status"], status)
    (run.directory / RUN_FILES["error"]).unlink(missing_ok=True)
    try:
        if state != "trained":
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
    summary = read_json(run.directory / RUN_FILES["summary"])
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
    write_json_atomic(run.directory / RUN_FILES["eval"], results)
    return results


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
    """Grid points of an earlier run of the sweep and of this one; a name may not change its settings."""
    merged = {p["name"]: p for p in first}
    for point in second:
        if point["name"] in merged and merged[point["name"]] != point:
            raise ValueError(
                f"grid point {point['name']} had other settings in {path} ({merged[point['name']]['train']}); "
                "runs from two recipes must not be mixed: use another --out"
            )
        merged.setdefault(point["name"], point)
    return list(merged.values())


def _write_yaml_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2.5 h``: an estimate's precision."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
