"""The training configuration: a tree of dataclasses, loaded from YAML with dotted command-line overrides.

Example (``configs/tiny.yaml``)::

    model: {preset: tiny, interface: {name: canonical}}
    data: {dir: data/gutenberg-4k}
    budget: 2M                 # tokens; "500 steps" gives a step budget
    batch_tokens: 16k          # global batch, in tokens
    micro_batch: 16            # sequences per process per micro-step
    optim: {lr: 1e-3, weight_decay: 0.1}
    schedule: {name: cosine, warmup_steps: 20}

Gradient accumulation is derived: ``batch_tokens = seq_len × micro_batch × world_size × grad_accum``, and
``plan()`` says which field to change when that does not divide. The vocabulary size comes from the dataset's
manifest, so ``model.vocab_size`` is normally left unset.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from tablefree.config_parsing import from_dict_with_overrides, load_yaml, parse_bytes, parse_count
from tablefree.interfaces.options import InterfaceConfig
from tablefree.model_config import PRESETS, ModelConfig, preset


@dataclass
class ModelSpec:
    """A preset plus overrides. Unset (None) fields keep the preset's value."""

    preset: str = "tiny"
    interface: InterfaceConfig = field(default_factory=InterfaceConfig)  # a name or {name, options}
    vocab_size: int | None = None  # normally unset: the dataset manifest's vocabulary size is used
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    d_ff: int | None = None
    max_seq_len: int | None = None
    rope_theta: float | None = None
    mlp: str | None = None
    norm: str | None = None
    norm_eps: float | None = None
    init_std: float | None = None

    def __post_init__(self) -> None:
        if type(self.interface) is InterfaceConfig or not isinstance(self.interface, InterfaceConfig):
            self.interface = InterfaceConfig.from_config(self.interface, "interface")  # `interface: affine`
        if self.preset not in PRESETS:
            raise ValueError(
                f"model.preset: unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}"
            )

    def build(self, dataset_vocab_size: int | None = None, seed: int | None = None) -> ModelConfig:
        """The ModelConfig: preset, then overrides, then the dataset's vocabulary size; interface seeds that
        follow the training seed (``seed: null``) are set to ``seed`` when given.

        An explicitly set ``vocab_size`` that disagrees with the dataset is an error (the model could not embed
        or predict the dataset's tokens); the preset's default vocabulary silently yields to the dataset's.
        """
        overrides = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("preset", "interface") and getattr(self, f.name) is not None
        }
        if dataset_vocab_size is not None:
            explicit = overrides.get("vocab_size")
            if explicit is not None and explicit != dataset_vocab_size:
                raise ValueError(
                    f"model.vocab_size is {explicit} but the dataset's tokenizer has {dataset_vocab_size} "
                    "tokens; remove model.vocab_size (it defaults to the dataset's) or use a matching dataset"
                )
            overrides["vocab_size"] = dataset_vocab_size
        config = preset(self.preset, interface=self.interface, **overrides)  # options parsed once, here
        return config if seed is None else config.resolve_seed(seed)


@dataclass
class DataConfig:
    dir: str = ""  # a prepared dataset (manifest.json, shards, tokenizer.json)
    shuffle: bool = True  # random windows (seeded permutation per epoch) instead of a sequential pass
    # Every k-th training window is held out as the *selection* split (0: none): data that neither training
    # nor the verdict's validation split uses, on which a learning-rate grid picks each interface's rate.
    select_every: int = 0

    def __post_init__(self) -> None:
        if self.select_every < 0 or self.select_every == 1:
            raise ValueError(
                f"data.select_every: expected 0 (no selection split) or k >= 2 (every k-th training window "
                f"held out), got {self.select_every}"
            )


@dataclass
class OptimConfig:
    """AdamW. Weight decay applies to matrices only: never to norm gains (1-D), and to the learned input table
    only when ``decay_embeddings`` is true (see docs/training.md for why the default is false)."""

    lr: float = 3e-4  # peak learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas: expected two numbers in [0, 1), got {self.betas}")
        if self.lr <= 0 or self.eps <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("optim: lr and eps must be > 0, weight_decay and grad_clip >= 0")


SCHEDULES = ("cosine", "wsd", "constant")


@dataclass
class ScheduleConfig:
    """Linear warmup, then ``cosine`` decay to ``min_lr``, or ``wsd`` (warmup-stable-decay: constant, then a
    linear decay to ``min_lr`` over the last ``decay_fraction`` of the steps), or ``constant``."""

    name: str = "cosine"
    warmup_steps: int = 0
    min_lr: float = 0.0  # absolute learning rate at the end of the decay
    decay_fraction: float = 0.2  # wsd only

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"schedule.name: expected one of {list(SCHEDULES)}, got {self.name!r}")
        if self.warmup_steps < 0 or self.min_lr < 0:
            raise ValueError("schedule: warmup_steps and min_lr must be >= 0")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ValueError(
                f"schedule.decay_fraction: expected a number in [0, 1], got {self.decay_fraction}"
            )


@dataclass
class TrainConfig:
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataConfig = field(default_factory=DataConfig)
    budget: str | int = "1M"  # tokens ("100B", "2.5M", 1000000) or steps ("5000 steps")
    batch_tokens: int = 16_384  # global batch per optimizer step, in tokens
    micro_batch: int = 8  # sequences per process per micro-step
    seq_len: int | None = None  # None: the model's max_seq_len
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    seed: int = 0  # model init (per parameter name) and data order
    device: str = "auto"  # auto (cuda when available) | cpu | cuda
    precision: str = "auto"  # auto (bf16 where the device multiplies it natively and faster) | fp32 | bf16
    compile: bool | str = "auto"  # auto (when a compiler is present and the run repays it) | true | false
    activation_checkpointing: bool = False
    parallel: str = "ddp"  # ddp | fsdp; used when launched under torchrun (fsdp also works on one process)
    peak_flops: float | None = None  # per device, for MFU; None: the measured matmul ceiling
    log_every: int = 10
    val_every: int = 0  # 0: validate only at the end
    val_batches: int = 20  # micro-batches of the val split per validation
    checkpoint_every: int = 0  # 0: checkpoint only at the end (and on SIGTERM/SIGINT)
    # Extra checkpoints at these steps, never pruned: the branch points of a budget-branched sweep (compare's
    # `grid.branch`), where shorter budgets start their own decay from this run's stable phase.
    checkpoint_steps: list[int] = field(default_factory=list)
    keep_last: int = 3  # checkpoints kept; 0 keeps all
    on_nonfinite: str = "stop"  # a NaN/inf loss or gradient norm: stop (the default) or skip that update
    # full: one model.safetensors + optimizer in train_state.pt (gathered to rank 0); sharded: each rank writes
    # and reads its own shards (torch.distributed.checkpoint); auto: sharded under FSDP2 with several processes;
    # none: no checkpoints at all (benchmarks)
    checkpoint_format: str = "auto"
    # the device memory the memory plan must fit before training starts (train.memory_plan): auto = the GPU's
    # total memory (no check on a CPU), off = no check, or a size such as 80GiB (checked on any device)
    device_memory: str = "auto"

    def __post_init__(self) -> None:
        self.budget = str(self.budget)
        parse_budget(self.budget)
        checks = [
            (self.device in ("auto", "cpu", "cuda"), f"device: expected auto|cpu|cuda, got {self.device!r}"),
            (
                self.precision in ("auto", "fp32", "bf16"),
                f"precision: expected auto|fp32|bf16, got {self.precision!r}",
            ),
            (
                isinstance(self.compile, bool) or self.compile == "auto",
                f"compile: expected auto, true or false, got {self.compile!r}",
            ),
            (self.parallel in ("ddp", "fsdp"), f"parallel: expected ddp|fsdp, got {self.parallel!r}"),
            (
                self.on_nonfinite in ("stop", "skip"),
                f"on_nonfinite: expected stop|skip, got {self.on_nonfinite!r}",
            ),
            (
                self.checkpoint_format in ("auto", "full", "sharded", "none"),
                f"checkpoint_format: expected auto|full|sharded|none, got {self.checkpoint_format!r}",
            ),
            (self.batch_tokens > 0, "batch_tokens: must be > 0"),
            (self.micro_batch > 0, "micro_batch: must be > 0"),
            (self.seq_len is None or self.seq_len > 0, "seq_len: must be > 0"),
            (self.log_every > 0, "log_every: must be > 0"),
            (
                min(self.val_every, self.checkpoint_every, self.keep_last, self.val_batches) >= 0,
                "intervals must be >= 0",
            ),
            (self.peak_flops is None or self.peak_flops > 0, "peak_flops: must be > 0"),
            (
                all(isinstance(step, int) and step > 0 for step in self.checkpoint_steps),
                f"checkpoint_steps: expected positive step numbers, got {self.checkpoint_steps}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.device_memory not in ("auto", "off"):
            try:
                parse_bytes(self.device_memory, "device_memory")
            except ValueError:
                raise ValueError(
                    f"device_memory: expected auto, off or a size such as 80GiB or 141GB, got {self.device_memory!r}"
                ) from None


def parse_budget(text: str | int) -> tuple[str, int]:
    """``("tokens", n)`` or ``("steps", n)`` from ``100B``, ``1_000_000`` or ``5000 steps``."""
    match = re.fullmatch(r"\s*(\S+?)\s*steps?\s*", str(text))
    kind, number = ("steps", match.group(1)) if match else ("tokens", str(text))
    value = parse_count(number, where="budget")
    if value <= 0:
        raise ValueError(f"budget: must be > 0, got {text!r}")
    return kind, value


@dataclass(frozen=True)
class Plan:
    """The numbers a run derives from its config, model and world size."""

    seq_len: int
    micro_batch: int
    world_size: int
    grad_accum: int
    tokens_per_step: int
    total_steps: int

    @property
    def total_tokens(self) -> int:
        return self.total_steps * self.tokens_per_step


def plan(config: TrainConfig, model_config: ModelConfig, world_size: int = 1) -> Plan:
    """Derive gradient accumulation and the step budget; errors name the fields to change."""
    seq_len = config.seq_len or model_config.max_seq_len
    if seq_len > model_config.max_seq_len:
        raise ValueError(f"seq_len ({seq_len}) exceeds model.max_seq_len ({model_config.max_seq_len})")
    per_micro_step = seq_len * config.micro_batch * world_size
    if config.batch_tokens % per_micro_step:
        raise ValueError(
            f"batch_tokens ({config.batch_tokens}) must be a multiple of seq_len ({seq_len}) × micro_batch "
            f"({config.micro_batch}) × world_size ({world_size}) = {per_micro_step}; change batch_tokens, "
            "micro_batch or seq_len"
        )
    total_steps = budget_steps(config.budget, config.batch_tokens)
    if config.schedule.warmup_steps > total_steps:
        raise ValueError(
            f"schedule.warmup_steps ({config.schedule.warmup_steps}) exceeds the run's {total_steps} steps"
        )
    return Plan(
        seq_len=seq_len,
        micro_batch=config.micro_batch,
        world_size=world_size,
        grad_accum=config.batch_tokens // per_micro_step,
        tokens_per_step=config.batch_tokens,
        total_steps=total_steps,
    )


def budget_steps(budget: str | int, batch_tokens: int) -> int:
    """Optimizer steps of a budget (``"2M"`` tokens or ``"500 steps"``) at ``batch_tokens`` per step."""
    kind, amount = parse_budget(budget)
    return amount if kind == "steps" else math.ceil(amount / batch_tokens)


def decay_start(total_steps: int, schedule: ScheduleConfig) -> int:
    """The last step at the peak rate before ``wsd``'s decay (the step a shorter budget branches at)."""
    return total_steps - round(schedule.decay_fraction * total_steps)


def lr_at(step: int, total_steps: int, lr: float, schedule: ScheduleConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based: the first update uses ``lr_at(1, ...)``)."""
    warmup = schedule.warmup_steps
    if warmup and step <= warmup:
        return lr * step / warmup
    if schedule.name == "constant":
        return lr
    if schedule.name == "cosine":
        progress = (step - warmup) / max(1, total_steps - warmup)
        return schedule.min_lr + 0.5 * (lr - schedule.min_lr) * (1.0 + math.cos(math.pi * min(1.0, progress)))
    # wsd: stable at lr, then linear decay to min_lr over the last decay_fraction of all steps
    stable_until = decay_start(total_steps, schedule)
    decay_steps = total_steps - stable_until
    if step <= stable_until or decay_steps == 0:
        return lr
    return lr + (schedule.min_lr - lr) * (step - stable_until) / decay_steps


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """A TrainConfig from a YAML file (or the defaults when ``path`` is None) and ``a.b=value`` overrides."""
    data = load_yaml(path) if path is not None else {}
    where = str(path) if path is not None else "config"
    return from_dict_with_overrides(TrainConfig, data, overrides or [], where)
