"""The compare config (``CompareConfig``, read by ``load_compare_config``) and the shared recipe it gives every
run (``base_recipe``). A run's own recipe and its place in the grid are ``tablefree.sweep.grid``'s; the plan
built from this config is ``tablefree.sweep.plan``'s."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablefree.config_parsing import (
    from_dict_with_overrides,
    load_yaml,
    parse_token_budgets,
    to_dict,
)
from tablefree.data.documents import SPLIT_RULES
from tablefree.interfaces import INTERFACES
from tablefree.launch import SlurmSpec
from tablefree.sweep.grid import GridPoint, point_name
from tablefree.train.recipe import parse_budget


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
    split_rule: str | None = (
        None  # None: prepare_dataset's default ("plan"); "keyed-hash": decided per document
    )
    val_max_tokens: int | None = None  # None: prepare_dataset's default (keyed-hash only: the validation cap)
    gutenberg: bool = False  # strip Project Gutenberg headers and footers
    text_field: str = "text"
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.split_rule is not None and self.split_rule not in SPLIT_RULES:
            raise ValueError(f"split_rule: expected one of {', '.join(SPLIT_RULES)}, got {self.split_rule!r}")


@dataclass
class EvalSection:
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
        if isinstance(self.lr, dict):
            unknown = [name for name in self.lr if name not in INTERFACES]
            if unknown:
                raise ValueError(
                    f"grid.lr: {', '.join(map(repr, unknown))} is not an interface; the map's keys are interface "
                    f"names, from {sorted(INTERFACES)}"
                )
            # YAML reads 1e-3 (no dot) as text: a map's rates are numbers as everywhere else in the config
            self.lr = {name: _rates(rates, f"grid.lr.{name}") for name, rates in self.lr.items()}
        else:
            _rates(self.lr, "grid.lr")
        for index, budget in enumerate(self.budget):
            try:
                parse_budget(budget)
            except ValueError:
                raise ValueError(
                    f"grid.budget[{index}]: expected a positive budget (tokens such as 500k, or '500 steps'), "
                    f"got {budget!r}"
                ) from None
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

    def points(self) -> list[GridPoint]:
        """Every grid point in order (models outer, then rates, budgets inner); [] without a grid."""
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
            points.append(GridPoint(point_name(model, budget, lr), overrides, self.interfaces_at(lr)))
        names = [p.name for p in points]
        if len(set(names)) != len(names):
            raise ValueError(f"grid: two points have the same name {names}; give each model a `name`")
        return points


def _rates(listed: Any, where: str) -> list[float]:
    """A list of positive learning rates; a number written as text (``1e-3`` in YAML) is read as the number."""
    if not isinstance(listed, list):
        raise ValueError(f"{where}: expected a list of positive rates, got {listed!r}")
    rates = []
    for index, rate in enumerate(listed):
        try:
            value = (
                float(rate) if isinstance(rate, (int, float, str)) and not isinstance(rate, bool) else None
            )
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise ValueError(f"{where}[{index}]: expected a positive number, got {rate!r}")
        rates.append(value if isinstance(rate, str) else rate)
    return rates


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
    eval: EvalSection = field(default_factory=EvalSection)
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
        if isinstance(self.grid.lr, dict):
            missing = [name for name in self.interfaces if name not in self.grid.lr]
            if missing:
                raise ValueError(
                    f"grid.lr: lists rates for {', '.join(self.grid.lr)} only, so {', '.join(missing)} would train "
                    f"no run; add {missing[0]}: [rates] to grid.lr, or leave {', '.join(missing)} out of interfaces"
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


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
