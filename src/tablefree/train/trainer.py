"""The training loop: ``train(config, run_dir, resume=False) -> summary``.

``Trainer`` does one run: set up (``__init__``), ``train_step``, ``validate``, ``save``, ``summary``, strung
together by ``run``; everything that changes from step to step lives in one ``TrainState``.

One optimizer step = ``grad_accum`` micro-steps of ``micro_batch`` sequences on each of ``world_size``
processes = ``batch_tokens`` tokens. A run directory holds::

    config.yaml      # the resolved TrainConfig (model fields filled in from the preset and the dataset)
    metrics.jsonl    # one JSON object per line: train records (step, tokens, train_loss, lr, grad_norm,
                     #   tokens_per_s, tflops, mfu, elapsed_s) and validation-estimate records (step, tokens,
                     #   val_loss_estimate, val_windows)
    summary.json     # tokens_seen, wall_time_s, tokens_per_s, final_train_loss, final_val_loss_estimate, ...

The in-training validation *estimate* (``val_loss_estimate``: the mean loss over ``val_windows`` =
val_batches × micro_batch windows of the val split) is named so everywhere, to keep it apart from the
evaluation over the whole validation split (``tablefree eval``), a different number.
    checkpoints/step_XXXXXXXX/   # see tablefree.train.checkpoints
    tensorboard/     # when the tensorboard package is installed

Determinism: the backbone of every interface is initialised identically for one seed (per-parameter-name
seeding in ``TablefreeLM.init_weights``), and batches depend only on (seed, step) through ``TokenLoader``.
Nothing else draws random numbers, so a resumed fp32 CPU run reproduces an uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import resource
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from tablefree.config_parsing import load_yaml, to_dict
from tablefree.cpu_memory import keep_freed_memory
from tablefree.data.loader import TokenLoader, read_manifest, verify_dataset
from tablefree.fileio import read_json, write_json_atomic, write_text_atomic, writing
from tablefree.hardware import Ceiling, datasheet_bf16_flops
from tablefree.hardware import peak_flops as measured_peak_flops
from tablefree.interfaces import check_token_ids, ids_checked_by_caller
from tablefree.model import build_model, next_token_loss
from tablefree.model_config import ModelConfig
from tablefree.model_files import COMPLETE_MARKER, META_FILE
from tablefree.params import param_breakdown
from tablefree.precision import (
    Decision,
    autocast_dtype,
    choose_compile,
    choose_precision,
    estimate_eager_seconds,
)
from tablefree.rundir import RUN_FILES, read_jsonl
from tablefree.train import checkpoints, sharded
from tablefree.train.parallelize import (
    DistInfo,
    all_reduce_mean,
    any_rank,
    barrier,
    destroy_distributed,
    init_distributed,
    parallelize,
)
from tablefree.train.recipe import ModelSpec, Plan, TrainConfig, lr_at, plan

CONFIG_FILE = RUN_FILES["config"]
METRICS_FILE = RUN_FILES["metrics"]
SUMMARY_FILE = RUN_FILES["summary"]
# Fault injection for the exact-resume test: the process SIGKILLs itself after this optimizer step.
KILL_AFTER_STEP_ENV = "TABLEFREE_FAULT_KILL_AFTER_STEP"


class NonFiniteLossError(ValueError):
    """The training loss or gradient norm became NaN or infinite, and the run stopped before updating the
    model; or the weights did, and no checkpoint was written."""

    def __init__(self, message: str, stop_reason: str = "non-finite loss") -> None:
        super().__init__(message)
        self.stop_reason = stop_reason


def flops_per_token(model_config: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token, as torchtitan's ``get_num_flop_per_token`` (pytorch/torchtitan,
    torchtitan/utils.py): 6·N for the matmuls of forward + backward over the N non-embedding parameters (the
    output head included, the input interface excluded, so all three interfaces count the same), plus
    12·L·H·hd·T for attention scores and values (2 matmuls forward, 4 backward, 2 FLOPs per multiply-add;
    causal sparsity not discounted)."""
    non_embedding = param_breakdown(model_config).non_embedding
    c = model_config
    return 6 * non_embedding + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: not on norm gains (1-D), nor on the learned input table
    unless ``optim.decay_embeddings``. Call after ``parallelize`` (FSDP2 replaces the parameters)."""
    optim = config.optim
    table = {id(p) for p in model.input.parameters()} if hasattr(model, "input") else set()
    decay, no_decay = [], []
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        is_table = id(parameter) in table
        if parameter.dim() >= 2 and (optim.decay_embeddings or not is_table):
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # Fused (one kernel over all tensors) on CUDA, and on the CPU for fp32 parameters: on 2 CPU threads it takes
    # a quarter of the default per-tensor loop's time (21 vs 80 ms per step for `small`). FSDP2's sharded
    # parameters under gloo take the same path as on GPUs, so its tests rehearse the device-side skip there.
    params = decay + no_decay
    on_cuda = any(p.device.type == "cuda" for p in params)
    fp32_cpu = all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    sharded = any(hasattr(p, "full_tensor") for p in params)  # DTensor shards under FSDP2
    fused = (on_cuda or fp32_cpu) and fused_adamw_is_safe(sharded, torch.__version__)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=fused)


def fused_adamw_is_safe(sharded: bool, torch_version: str) -> bool:
    """False where the fused AdamW leaks host memory: over DTensor (FSDP2) parameters in torch 2.10-2.12 it keeps
    one DTensorSpec per parameter tensor per step (pytorch/pytorch#188174, #181761; torchtitan#3790: tens of GB
    over a long run). Not seen in 2.13. Those runs use the per-tensor loop, and read the non-finite flag each step."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    return not (sharded and (2, 10) <= (major, minor) < (2, 13))


def resolved_config(config: TrainConfig, model_config: ModelConfig, seq_len: int) -> TrainConfig:
    """The config with every model field and the sequence length filled in (what config.yaml records)."""
    model_fields = {k: v for k, v in to_dict(model_config).items() if k != "interface"}
    spec = ModelSpec(preset=config.model.preset, interface=model_config.interface, **model_fields)
    return replace(config, model=spec, seq_len=seq_len)


def train(
    config: TrainConfig,
    run_dir: str | Path,
    resume: bool | str = False,
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train a model; returns the summary (also written to ``run_dir/summary.json``).

    ``resume=True`` continues the run in ``run_dir`` from its newest checkpoint that loads, with its recorded
    recipe: a field of ``config`` that differs from it is refused unless named in ``allow_change`` (then it is
    recorded in ``config_changes.json``). Nothing to resume is an error; ``resume="auto"`` resumes when there
    is a checkpoint and starts afresh otherwise. Launched under torchrun, the processes share the work with
    DDP or FSDP2 (``config.parallel``).
    """
    run_dir = Path(run_dir)
    if resume not in (True, False, "auto"):
        raise ValueError(f"resume: expected True, False or 'auto', got {resume!r}")
    if resume == "auto":
        resume = bool(checkpoints.complete_checkpoints(run_dir))
    elif resume and not checkpoints.complete_checkpoints(run_dir):
        raise FileNotFoundError(nothing_to_resume(run_dir))
    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = init_distributed(config.device, force_process_group=config.parallel == "fsdp")
    try:
        with RunDirLock(run_dir, info):
            return Trainer(config, run_dir, bool(resume), info, allow_change).run()
    finally:
        if owns_process_group:  # leave a caller's process group alone
            destroy_distributed()


def nothing_to_resume(run_dir: Path) -> str:
    """The error for ``--resume`` on a run directory without a checkpoint, saying where it looked."""
    where = run_dir / checkpoints.CHECKPOINTS_DIR
    if not run_dir.exists():
        found = f"{run_dir} does not exist"
    elif not where.exists():
        found = f"{run_dir} has no {checkpoints.CHECKPOINTS_DIR}/ directory"
    else:
        found = f"{where} holds no complete step_* checkpoint"
    return f"--resume: nothing to resume: {found} (looked for {where}/step_*/COMPLETE). Check --run-dir, or start the run without --resume"


@dataclass
class TrainState:
    """What the loop carries from step to step, and what a checkpoint's ``train_state.pt`` restores besides the
    optimizer, the random generators and the loader position (torchtitan's ``TrainState``)."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0
    wall_time_s: float = 0.0  # across resumes
    train_time_s: float = 0.0  # training steps only (no validation, no checkpointing), across resumes
    last_train_loss: float | None = None
    last_val_loss_estimate: float | None = None
    best_val_loss_estimate: float | None = None
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient norm (on_nonfinite: skip)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any], where: str = "train state") -> TrainState:
        """The fields this version knows (keys of older checkpoints, ``schedule`` and ``world_size``, are
        ignored); a field of the wrong type is a CheckpointError naming ``where``."""
        saved = {LEGACY_STATE_KEYS.get(key, key): value for key, value in saved.items()}
        values = {f.name: saved[f.name] for f in fields(cls) if f.name in saved}
        for name, value in values.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            integer = name in ("step", "tokens_seen", "skipped_steps")
            if not (number and (not integer or isinstance(value, int))) and not (
                value is None and not integer
            ):
                raise checkpoints.CheckpointError(f"{where}: field {name!r} has the wrong type ({value!r})")
        return cls(**values)


# train_state.pt keys of older versions -> their TrainState field
LEGACY_STATE_KEYS = {"last_val_loss": "last_val_loss_estimate", "best_val_loss": "best_val_loss_estimate"}


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's numbers, for the log."""

    step: int
    tokens: int  # tokens seen after this step
    loss: float
    grad_norm: float
    lr: float
    seconds: float
    skipped: bool = False  # the update was skipped (non-finite loss or gradient norm, on_nonfinite: skip)


# with several processes, a stop signal is agreed on at least this often (and at every log, validation and save)
STOP_CHECK_STEPS = 10


@dataclass
class PendingStep:
    """A step whose loss and gradient norm are still on the device: they are read for a batch of steps at once
    (``Trainer.read_steps``), so the hot loop does not wait for the device every step."""

    step: int
    tokens: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    seconds: float


class Trainer:
    """One training run: ``setup`` (in ``__init__``), ``train_step``, ``validate``, ``save``, ``summary``; ``run``
    strings them together. Everything that changes from step to step is in ``self.state``."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        resume: bool,
        info: DistInfo,
        allow_change: Sequence[str] = (),
    ) -> None:
        self.started = time.perf_counter()
        self.info, self.run_dir, self.device = info, run_dir, info.device

        # data, model config and the run's numbers
        self.data_dir = Path(config.data.dir)
        self.manifest = read_manifest(self.data_dir)
        check_data(self.data_dir, info)
        if resume:  # before the model is built: a different dataset is named as such, not as a vocab_size
            check_dataset(run_dir, self.manifest, self.data_dir)
        self.model_config = config.model.build(
            dataset_vocab_size=int(self.manifest["vocab_size"]), seed=config.seed
        )
        self.plan = plan(config, self.model_config, info.world_size)
        self.config = config = resolved_config(config, self.model_config, self.plan.seq_len)
        self.breakdown = param_breakdown(self.model_config)
        self.flops_per_token = flops_per_token(self.model_config, self.plan.seq_len)
        self.precision_choice = choose_precision(config.precision, self.device)
        self.precision = self.precision_choice.value
        self.memory_choice = keep_freed_memory(self.device)
        # MFU's ceiling: the measured matmul rate of the dtype in use on this device (cached per machine).
        self.ceiling = measured_peak_flops(
            self.device, autocast_dtype(self.precision), override=config.peak_flops
        )
        self.peak_flops = self.ceiling.flops
        run_flops = self.flops_per_token * self.plan.total_tokens / info.world_size
        self.compile_choice = choose_compile(
            config.compile, self.device, estimated_eager_s=estimate_eager_seconds(run_flops, self.peak_flops)
        )
        self.tokenizer_path = self.data_dir / self.manifest.get("tokenizer_file", "tokenizer.json")

        self.changes = self._check_run_dir(resume, allow_change)
        self._build_model_and_data()
        self.state = TrainState()
        self.resumed_from = self._resume() if resume else None
        if self.changes and info.is_main:
            record_changes(run_dir, self.changes, self.state.step)
        self.prior_wall_s = self.state.wall_time_s
        self.start_step = self.state.step
        self.saved_at = -1
        self._write_run_files()

    # ---- setup

    def _check_run_dir(self, resume: bool, allow_change: Sequence[str]) -> list[Change]:
        """A fresh run must not overwrite another run's checkpoints; a resumed one continues its recorded recipe.
        Returns the changes to the recipe that ``allow_change`` permits."""
        run_dir = self.run_dir
        changes: list[Change] = []
        if not resume and has_checkpoints(run_dir):
            raise FileExistsError(
                f"{run_dir} already holds a run; pass --resume to continue it, or choose another --run-dir"
            )
        if resume:
            changes = check_resumable(run_dir, self.config, allow_change)
        elif self.info.is_main and (run_dir / METRICS_FILE).exists():
            print(
                f"starting {run_dir} over: it holds no checkpoint (a run stopped before its first save)",
                flush=True,
            )
        barrier()  # every process has checked before rank 0 writes anything
        return changes

    def _build_model_and_data(self) -> None:
        config, info = self.config, self.info
        # FSDP2: built on the meta device; parallelize() materialises only this rank's shards.
        build_on = "meta" if config.parallel == "fsdp" else self.device
        self.model = build_model(self.model_config, seed=config.seed, device=build_on)
        self.train_model = parallelize(
            self.model,
            info,
            parallel=config.parallel,
            compile=self.compile_choice.value,
            activation_checkpointing=config.activation_checkpointing,
            param_dtype=torch.bfloat16 if self.precision == "bf16" else None,
            seed=config.seed,
        )
        self.optimizer = build_optimizer(self.model, config)
        self.sharded_checkpoints = config.checkpoint_format == "sharded" or (
            config.checkpoint_format == "auto" and config.parallel == "fsdp" and info.world_size > 1
        )
        loader_args = dict(seed=config.seed, rank=info.rank, world_size=info.world_size)
        self.train_loader = TokenLoader.from_dir(
            self.data_dir,
            "train",
            self.plan.seq_len,
            config.micro_batch,
            shuffle=config.data.shuffle,
            **loader_args,
        )
        # The estimate's windows are spread over the whole val split by a fixed permutation (seed 0, the same
        # for every run, so runs stay paired), not its first windows: those fall in one or two documents.
        self.val_loader = TokenLoader.from_dir(
            self.data_dir,
            "val",
            self.plan.seq_len,
            config.micro_batch,
            shuffle=True,
            **{**loader_args, "seed": 0},
        )
        # the in-training validation estimate's size (validation_loss reads this many windows)
        self.val_windows = min(config.val_batches * config.micro_batch, self.val_loader.num_chunks)
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16" and config.parallel != "fsdp"  # FSDP2 casts parameters itself
            else contextlib.nullcontext()
        )

    def _resume(self) -> Path | None:
        """Restore the newest checkpoint that loads; a damaged newer one is skipped (and set aside) with the
        reason said. None when the run has no checkpoint yet; a CheckpointError when none loads."""
        try:
            found = checkpoints.load_newest(
                self.run_dir,
                lambda checkpoint: restore_checkpoint(
                    checkpoint,
                    self.train_model,
                    self.optimizer,
                    self.train_loader,
                    self.manifest,
                    self.plan,
                ),
            )
        except checkpoints.CheckpointError as error:
            raise checkpoints.CheckpointError(f"--resume: {error}") from None
        if found is None:
            return None
        checkpoint, self.state, skipped = found
        if self.info.is_main:
            for partial in checkpoints.incomplete_checkpoints(self.run_dir):
                if partial.name > checkpoint.name:
                    print(
                        f"--resume: ignored {partial.name}: no {COMPLETE_MARKER} marker (an incomplete checkpoint)"
                    )
        barrier()  # every process has loaded before rank 0 moves anything
        if self.info.is_main:
            for damaged, error in skipped:
                print(f"--resume: skipped {damaged.name}: {error}", flush=True)
                print(f"--resume: {damaged.name} moved to {checkpoints.set_aside(damaged)}", flush=True)
        return checkpoint

    def _write_run_files(self) -> None:
        """config.yaml, metrics.jsonl cut back to the resumed step, and the run's description."""
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if (
                self.resumed_from is None
            ):  # a resumed run keeps its recorded recipe; changes go to CHANGES_FILE
                write_text_atomic(
                    self.run_dir / CONFIG_FILE, yaml.safe_dump(to_dict(self.config), sort_keys=False)
                )
            truncate_metrics(self.run_dir / METRICS_FILE, after_step=self.state.step)
        self.metrics = MetricsLog(self.run_dir, enabled=self.info.is_main)
        if self.info.is_main:
            describe_run(
                self.config,
                self.model_config,
                self.plan,
                self.info,
                self.breakdown,
                self.flops_per_token,
                self.run_dir,
                self.precision_choice,
                self.compile_choice,
                self.ceiling,
                self.memory_choice,
            )
            if self.resumed_from is not None:
                print(
                    f"resumed from {self.resumed_from} (step {self.state.step}, {self.state.tokens_seen:,} tokens)",
                    flush=True,
                )

    # ---- the loop

    def run(self) -> dict[str, Any]:
        """Train to the end of the budget (or a stop signal); write and return the summary."""
        state, total_steps = self.state, self.plan.total_steps
        stop = StopSignal()
        kill_after = int(os.environ.get(KILL_AFTER_STEP_ENV, "0"))
        self.progress = tqdm(
            total=total_steps,
            initial=state.step,
            unit="step",
            dynamic_ncols=True,
            disable=not (self.info.is_main and sys.stderr.isatty()),
        )
        self.interval_s, self.interval_steps = 0.0, 0
        self.pending: list[PendingStep] = []
        self.halted = torch.zeros((), dtype=torch.bool, device=self.device)  # on_nonfinite: stop
        stop_reason = "completed"
        self.train_model.train()
        try:
            with stop.installed():
                while state.step < total_steps:
                    self.pending.append(self.train_step())
                    validating = bool(
                        self.config.val_every
                        and state.step % self.config.val_every == 0
                        and state.step < total_steps
                    )
                    saving = bool(
                        self.config.checkpoint_every and state.step % self.config.checkpoint_every == 0
                    )
                    reading = (
                        validating
                        or saving
                        or state.step % self.config.log_every == 0
                        or state.step == total_steps
                        or state.step == kill_after
                        or (self.info.world_size > 1 and state.step % STOP_CHECK_STEPS == 0)
                    )
                    if reading:  # before anything is validated or saved: a NaN step stops here
                        self.read_steps()
                    # several processes agree on a stop with an all-reduce (a host wait), so only at read points
                    stopping = (self.info.world_size == 1 or reading) and any_rank(
                        stop.requested is not None, self.device
                    )
                    if stopping:
                        self.read_steps()
                    if validating:
                        self.validate()
                    if saving or stopping:
                        self.save()
                    if stopping:
                        stop_reason = f"stopped by {stop.requested or 'a signal on another process'}"
                        if self.info.is_main:
                            print(
                                f"\n{stop_reason} after step {state.step}; "
                                + (
                                    "no checkpoint (checkpoint_format: none)."
                                    if self.config.checkpoint_format == "none"
                                    else f"checkpoint saved. Continue with `tablefree train --resume --run-dir "
                                    f"{self.run_dir}` (in a sweep: re-run the same `tablefree compare` command)."
                                ),
                                flush=True,
                            )
                        break
                    if kill_after and state.step == kill_after:
                        os.kill(os.getpid(), signal.SIGKILL)

            completed = state.step >= total_steps and stop_reason == "completed"
            if completed and not self._resumed_a_finished_run():
                self.validate()
                if self.saved_at != state.step:
                    self.save()
        except NonFiniteLossError as error:
            self._write_summary(self.summary(completed=False, stop_reason=error.stop_reason))
            raise
        finally:
            self.progress.close()
            self.metrics.close()
        summary = self.summary(completed=completed, stop_reason=stop_reason)
        self._write_summary(summary)
        self._print_done(summary)
        return summary

    def _resumed_a_finished_run(self) -> bool:
        return (
            self.resumed_from is not None
            and self.state.step == self.start_step
            and self.state.last_val_loss_estimate is not None
        )

    def train_step(self) -> PendingStep:
        """One optimizer step of ``grad_accum`` micro-steps. The loss and gradient norm stay on the device
        (``read_steps`` reads them later); a non-finite one skips the update there: the fused AdamW takes the flag
        as ``found_inf`` (as with a gradient scaler), other optimizers read it now. With ``on_nonfinite: stop``
        the flag sticks, so no update is applied after it until ``read_steps`` stops the run."""
        state, run_plan = self.state, self.plan
        step_start = time.perf_counter()
        step = state.step + 1
        lr = lr_at(step, run_plan.total_steps, self.config.optim.lr, self.config.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        loss_sum = torch.zeros((), device=self.device)
        for micro_step in range(run_plan.grad_accum):
            inputs, targets = device_batch(next(self.train_loader), self.device, self.model_config.vocab_size)
            sync = micro_step == run_plan.grad_accum - 1
            with gradient_sync(self.train_model, sync), self.autocast, ids_checked_by_caller():
                loss = next_token_loss(self.train_model(inputs), targets)  # ids checked in device_batch
            (loss / run_plan.grad_accum).backward()
            loss_sum += loss.detach()
        mean_loss = all_reduce_mean(loss_sum / run_plan.grad_accum).float()
        max_norm = self.config.optim.grad_clip if self.config.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.train_model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        grad_norm = grad_norm.float().to(mean_loss.device)

        bad = ~(torch.isfinite(mean_loss) & torch.isfinite(grad_norm))
        if self.config.on_nonfinite == "stop":
            self.halted |= bad
            bad = self.halted
        # per group: a loaded optimizer state brings its groups' settings (an older run's foreach included)
        if all(group.get("fused") for group in self.optimizer.param_groups):
            self.optimizer.found_inf = bad.float()  # the fused kernel skips the update and its step count
            self.optimizer.step()
            del self.optimizer.found_inf  # as a gradient scaler does: no later step() sees a stale flag
        elif not bad.item():
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        seconds = time.perf_counter() - step_start
        state.step = step
        state.tokens_seen += run_plan.tokens_per_step
        state.train_time_s += seconds
        return PendingStep(step, state.tokens_seen, mean_loss, grad_norm, lr, seconds)

    def read_steps(self) -> None:
        """Read the pending steps' losses and gradient norms in one host-device transfer, then account and log
        each step in order; the first non-finite step stops the run (``on_nonfinite: stop``, the default)."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        start = time.perf_counter()
        values = torch.stack([torch.stack([p.loss, p.grad_norm]) for p in pending]).tolist()
        wait = time.perf_counter() - start  # the device's queued work finishing: part of the last step
        pending[-1].seconds += wait
        self.state.train_time_s += wait
        for entry, (loss, norm) in zip(pending, values, strict=True):
            finite = math.isfinite(loss) and math.isfinite(norm)
            if not finite:
                self._non_finite(entry.step, loss, norm)
                self.state.skipped_steps += 1
            else:
                self.state.last_train_loss = loss
            self.log_step(
                StepResult(entry.step, entry.tokens, loss, norm, entry.lr, entry.seconds, skipped=not finite)
            )

    def _non_finite(self, step: int, loss: float, grad_norm: float) -> None:
        """A NaN/inf loss or gradient norm (the update was not applied): stop (the default), or with
        ``on_nonfinite: skip`` say so and go on to the next batch."""
        what = (
            f"the training loss is {loss}"
            if not math.isfinite(loss)
            else f"the gradient norm is {grad_norm} (training loss {loss:.4f})"
        )
        if self.config.on_nonfinite == "skip":
            if self.info.is_main:
                print(f"step {step}: {what}; update skipped (on_nonfinite: skip)", flush=True)
            return
        # no update was applied from this step on (the flag stuck): the model is that of the step before
        self.state.tokens_seen -= (self.state.step - step + 1) * self.plan.tokens_per_step
        self.state.step = step - 1
        last = checkpoints.latest_checkpoint(self.run_dir)
        raise NonFiniteLossError(
            f"step {step}: {what}; stopped without updating the model. "
            + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet.")
            + " (on_nonfinite=skip skips such updates instead.)",
            stop_reason=f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step}",
        )

    def log_step(self, result: StepResult) -> None:
        """A metrics record and a progress line every ``log_every`` steps (and at the last step)."""
        total_steps = self.plan.total_steps
        self.interval_s += result.seconds
        self.interval_steps += 1
        if result.skipped:  # always recorded, without a train_loss (readers of train_loss see only updates)
            self.metrics.write(
                {
                    "step": result.step,
                    "tokens": result.tokens,
                    "skipped_update": "non-finite loss or gradient norm",
                    "loss": result.loss,
                    "grad_norm": result.grad_norm,
                    "lr": result.lr,
                }
            )
        elif result.step % self.config.log_every == 0 or result.step == total_steps:
            tokens_per_s = self.interval_steps * self.plan.tokens_per_step / max(self.interval_s, 1e-9)
            tflops = self.flops_per_token * tokens_per_s / self.info.world_size / 1e12  # achieved, per device
            mfu = tflops * 1e12 / self.peak_flops
            self.metrics.write(
                {
                    "step": result.step,
                    "tokens": result.tokens,
                    "train_loss": result.loss,
                    "lr": result.lr,
                    "grad_norm": result.grad_norm,
                    "tokens_per_s": tokens_per_s,
                    "tflops": tflops,
                    "mfu": mfu,
                    "elapsed_s": self.wall_time_s(),
                }
            )
            eta = (total_steps - result.step) * self.interval_s / self.interval_steps
            self.progress.set_postfix_str(
                f"loss {result.loss:.4f} | {human(result.tokens)} tok | {human(tokens_per_s)} tok/s | "
                f"{tflops:.3g} TFLOP/s, MFU {100 * mfu:.1f}%",
                refresh=False,
            )
            if self.info.is_main and self.progress.disable:
                print(
                    f"step {result.step}/{total_steps} | loss {result.loss:.4f} | lr {result.lr:.2e} | "
                    f"{human(result.tokens)} tok | {human(tokens_per_s)} tok/s | {tflops:.3g} TFLOP/s, "
                    f"MFU {100 * mfu:.1f}% | "
                    f"ETA {format_seconds(eta)}",
                    flush=True,
                )
            self.interval_s, self.interval_steps = 0.0, 0
        self.progress.update(1)

    def validate(self) -> float:
        """The validation-loss estimate now, over ``val_windows`` windows spread over the val split (recorded
        in the state and metrics.jsonl as ``val_loss_estimate``)."""
        state = self.state
        estimate = validation_loss(
            self.train_model, self.val_loader, self.config.val_batches, self.device, self.autocast
        )
        state.last_val_loss_estimate = estimate
        if state.best_val_loss_estimate is None or estimate < state.best_val_loss_estimate:
            state.best_val_loss_estimate = estimate
        self.metrics.write(
            {
                "step": state.step,
                "tokens": state.tokens_seen,
                "val_loss_estimate": estimate,
                "val_windows": self.val_windows,
            }
        )
        return estimate

    # ---- checkpoints and summaries

    def wall_time_s(self) -> float:
        return self.prior_wall_s + time.perf_counter() - self.started

    def save(self) -> Path | None:
        """A checkpoint of the current step (a collective: every process calls it; rank 0 writes)."""
        state = self.state
        state.wall_time_s = self.wall_time_s()
        if self.config.checkpoint_format == "none":  # benchmarks: a 1.7B checkpoint is 21 GB and a minute
            self.saved_at = state.step
            return None
        poisoned = checkpoints.non_finite_parameters(self.model)  # each rank checks its own shards
        if any_rank(bool(poisoned), self.device):
            last = checkpoints.latest_checkpoint(self.run_dir)
            raise NonFiniteLossError(
                f"step {state.step}: non-finite weights (NaN or inf) in {', '.join(poisoned[:3]) or 'the model'}; "
                "no checkpoint written. "
                + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet."),
                stop_reason=f"non-finite weights at step {state.step}",
            )
        if self.sharded_checkpoints:  # every rank writes its shards into the staging directory first
            staging = checkpoints.staging_dir(self.run_dir, state.step)
            if self.info.is_main:
                shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while saving
            barrier()
            sharded.save_sharded(staging, self.train_model, self.optimizer)
            model_state, optim_state = None, {"in": sharded.SHARDED_DIR}
        else:
            model_state, optim_state = checkpoints.full_state(self.train_model, self.optimizer)
        path = None
        if self.info.is_main:
            train_state = {
                **state.state_dict(),
                "optimizer": optim_state,
                "rng": checkpoints.rng_state(),
                "loader": self.train_loader.state_dict(),
            }
            meta = {
                "step": state.step,
                "tokens_seen": state.tokens_seen,
                "tokenizer_hash": self.manifest.get("tokenizer_hash"),
                "data_dir": str(self.data_dir),
                "interface": self.model_config.interface.name,
                "seed": self.config.seed,
                "train_loss": state.last_train_loss,
                "val_loss_estimate": state.last_val_loss_estimate,
            }
            with writing(checkpoints.staging_dir(self.run_dir, state.step)):
                path = checkpoints.save_checkpoint(
                    self.run_dir,
                    state.step,
                    model_state,
                    train_state,
                    {"model": to_dict(self.model_config), "train": to_dict(self.config)},
                    meta,
                    self.tokenizer_path if self.tokenizer_path.exists() else None,
                    keep_last=self.config.keep_last,
                )
        barrier()
        self.saved_at = state.step
        return path

    def summary(self, completed: bool, stop_reason: str) -> dict[str, Any]:
        """What summary.json holds: the run's outcome, losses, throughput and shape."""
        state = self.state
        tokens_per_s = state.tokens_seen / state.train_time_s if state.train_time_s > 0 else 0.0
        return {
            "completed": completed,
            "stop_reason": stop_reason,
            "step": state.step,
            "total_steps": self.plan.total_steps,
            "tokens_seen": state.tokens_seen,
            "wall_time_s": self.wall_time_s(),
            "train_time_s": state.train_time_s,
            "tokens_per_s": tokens_per_s,
            "mfu": self.flops_per_token * tokens_per_s / (self.peak_flops * self.info.world_size),
            "tflops_per_device": self.flops_per_token * tokens_per_s / self.info.world_size / 1e12,
            "flops_per_token": self.flops_per_token,
            "peak_flops_per_device": self.peak_flops,
            "datasheet_bf16_flops_per_device": datasheet_bf16_flops(self.device),
            "peak_flops_source": {
                "source": self.ceiling.source,
                "dtype": self.ceiling.dtype,
                **self.ceiling.provenance,
            },
            "final_train_loss": state.last_train_loss,
            "final_val_loss_estimate": state.last_val_loss_estimate,
            "best_val_loss_estimate": state.best_val_loss_estimate,
            "val_estimate_windows": self.val_windows,
            "skipped_steps": state.skipped_steps,
            "params": self.breakdown.as_dict(),
            "interface": self.model_config.interface.name,
            "seed": self.config.seed,
            "world_size": self.info.world_size,
            "device": str(self.device),
            "precision": self.precision,
            "precision_reason": self.precision_choice.reason,
            "compiled": self.compile_choice.value,
            "compile_reason": self.compile_choice.reason,
            "grad_accum": self.plan.grad_accum,
            "peak_memory_gb": peak_memory_gb(self.device),
        }

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if self.info.is_main:
            write_json_atomic(self.run_dir / SUMMARY_FILE, finite_or_null(summary))

    def _print_done(self, summary: dict[str, Any]) -> None:
        """One closing line; an interrupted run says so and shows only the numbers it has."""
        if not self.info.is_main:
            return
        state = self.state
        parts = [f"step {state.step}/{self.plan.total_steps}", f"{state.tokens_seen:,} tokens"]
        if state.last_train_loss is not None:
            parts.append(f"train loss {state.last_train_loss:.4f}")
        if state.last_val_loss_estimate is not None:
            parts.append(f"val loss estimate ({self.val_windows} windows) {state.last_val_loss_estimate:.4f}")
        parts.append(f"{human(summary['tokens_per_s'])} tok/s")
        head = "done" if summary["completed"] else f"stopped ({summary['stop_reason']})"
        print(f"{head}: {', '.join(parts)} -> {self.run_dir}", flush=True)


# --------------------------------------------------------------------------------------------------------
# Pieces of the loop


def device_batch(
    batch: tuple[torch.Tensor, torch.Tensor], device: torch.device, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A loader batch on ``device``: token ids range-checked here, on the CPU (a check of the device tensor would
    make the host wait for the device), and copied asynchronously from pinned memory on CUDA."""
    inputs, targets = batch
    check_token_ids(inputs, vocab_size)
    check_token_ids(targets, vocab_size)
    if device.type == "cuda":
        inputs, targets = inputs.pin_memory(), targets.pin_memory()
    return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-step of an accumulation (DDP and FSDP2)."""
    if hasattr(model, "no_sync") and not sync:  # DDP
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    yield


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    loader: TokenLoader,
    val_batches: int,
    device: torch.device,
    autocast: Any,
) -> float:
    """Mean loss over ``val_batches × micro_batch`` windows of the val split (the loader's order), whatever the world
    size (each process takes its slots; padding slots beyond the set are masked out)."""
    total = min(val_batches * loader.batch_size, loader.num_chunks)
    micro_steps = math.ceil(total / (loader.batch_size * loader.world_size))
    sums = torch.zeros(2, device=device, dtype=torch.float64)  # (sum of per-window losses, windows)
    model.eval()
    for micro_step in range(micro_steps):
        inputs, targets = loader.batch(micro_step)
        keep = torch.from_numpy(loader.slots(micro_step) < total).to(device)
        with autocast:
            logits = model(inputs.to(device))
        per_window = next_token_loss(logits, targets.to(device), reduction="none").mean(dim=1).double()
        sums += torch.stack([(per_window * keep).sum(), keep.sum().double()])
    model.train()
    sums = all_reduce_mean(sums)  # mean of sums = sums / world; the ratio is unchanged
    return float(sums[0] / sums[1])


class StopSignal:
    """SIGTERM/SIGINT ask the loop to save and stop after the current step; a second SIGINT interrupts."""

    def __init__(self) -> None:
        self.requested: str | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals can only be handled on the main thread
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class MetricsLog:
    """metrics.jsonl (appended, one flushed line per record) and TensorBoard when it is installed."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.handle = open(self.path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115
        self.tensorboard = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:
                pass

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = finite_or_null(record)
        with writing(self.path):
            self.handle.write(json.dumps(record, allow_nan=False) + "\n")
            self.handle.flush()
        if self.tensorboard is not None:
            for key, value in record.items():
                if key not in ("step",) and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def finite_or_null(value: Any) -> Any:
    """``value`` with every NaN/inf float replaced by None: strict JSON has no NaN, and a bare ``NaN`` in
    metrics.jsonl or summary.json breaks other readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


class RunDirLock:
    """An exclusive lock on a run directory (``RUN_DIR/.lock``, held by the main process), so two trainings
    never write one run. It is an ``flock``: the kernel releases it when the process exits, however it exits,
    so a killed run never leaves a stale lock behind."""

    FILE = ".lock"

    def __init__(self, run_dir: Path, info: DistInfo) -> None:
        self.run_dir, self.info, self.handle = run_dir, info, None

    def __enter__(self) -> RunDirLock:
        error = None
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path = self.run_dir / self.FILE
            self.handle = open(path, "a+", encoding="utf-8")
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.handle.seek(0)
                holder = self.handle.read().strip() or "unknown"
                self.handle.close()
                self.handle = None
                error = (
                    f"{self.run_dir} is in use by another training process (pid {holder}; lock {path}). Wait for "
                    "it to finish or stop it; the lock is released when that process exits"
                )
            else:
                self.handle.seek(0)
                self.handle.truncate()
                self.handle.write(f"{os.getpid()}\n")
                self.handle.flush()
        if any_rank(error is not None, self.info.device):
            raise RunDirInUseError(error or f"{self.run_dir} is in use by another training process")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


class RunDirInUseError(FileExistsError):
    """Another process is training in this run directory."""


def truncate_metrics(path: Path, after_step: int) -> None:
    """Drop records past ``after_step`` (left by a process killed after its last checkpoint), atomically; a torn
    last line goes too (``rundir.read_jsonl``'s one rule), and an old bare NaN becomes null."""
    if not path.exists():
        return
    kept = [record for record in read_jsonl(path) if record.get("step", 0) <= after_step]
    write_text_atomic(path, "".join(json.dumps(finite_or_null(r), allow_nan=False) + "\n" for r in kept))


# Fields that decide what the run computes and cannot change on resume, even when asked: the weights, the
# data order and the position in it are tied to them.
FIXED_ON_RESUME = ("model", "seed", "seq_len", "batch_tokens")
# Fields that say how the run executes, not what it computes: free to change on resume (another machine).
OPERATIONAL_FIELDS = (
    "device",
    "compile",
    "activation_checkpointing",
    "parallel",
    "peak_flops",
    "log_every",
    "val_every",
    "checkpoint_every",
    "keep_last",
    "micro_batch",
    "on_nonfinite",
    "checkpoint_format",
)
CHANGES_FILE = "config_changes.json"


@dataclass(frozen=True)
class Change:
    """A field of the recipe changed on resume."""

    field: str  # dotted, e.g. optim.lr
    recorded: Any
    now: Any


def has_checkpoints(run_dir: Path) -> bool:
    """Whether the run directory holds checkpoints (complete ones, or damaged ones set aside)."""
    root = run_dir / checkpoints.CHECKPOINTS_DIR
    return bool(checkpoints.complete_checkpoints(run_dir)) or any(root.glob(f"{checkpoints.DAMAGED_PREFIX}*"))


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


def read_changes(run_dir: Path) -> list[dict[str, Any]]:
    """The history of recipe changes made on resume (``config_changes.json``), oldest first."""
    path = run_dir / CHANGES_FILE
    if not path.exists():
        return []
    history = read_json(path)
    if not isinstance(history, list) or not all(
        isinstance(entry, dict) and {"after_step", "field", "to"} <= entry.keys() for entry in history
    ):
        raise ValueError(f"{path}: expected a list of {{after_step, field, from, to}} records")
    return history


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's current recipe: config.yaml (as first written, never rewritten) with the changes of
    config_changes.json applied in order; None when the run has no config.yaml."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return None
    recipe = load_yaml(path)
    for entry in read_changes(run_dir):
        set_dotted(recipe, entry["field"], entry["to"])
    return recipe


def check_resumable(run_dir: Path, config: TrainConfig, allow_change: Sequence[str] = ()) -> list[Change]:
    """Resuming continues the recorded recipe. Each field that differs is named; fields of FIXED_ON_RESUME
    are refused always, others unless named (or their section named) in ``allow_change``. Returns the
    permitted changes."""
    recorded = recorded_config(run_dir)
    if recorded is None:
        return []
    where = run_dir / CONFIG_FILE
    was, now = flatten(recorded), flatten(to_dict(config))
    differing = [  # a field only one side has (a field added by a later version) is not a change
        Change(name, was[name], now[name])
        for name in sorted(was.keys() & now.keys())
        if was[name] != now[name] and name.split(".")[0] not in OPERATIONAL_FIELDS
    ]

    def listed(changes: list[Change]) -> str:
        return "\n".join(f"  {c.field}: {c.recorded!r} recorded, {c.now!r} now" for c in changes)

    fixed = [c for c in differing if c.field.split(".")[0] in FIXED_ON_RESUME]
    if fixed:
        raise ValueError(
            f"--resume: the run in {run_dir} was trained with a different experiment ({where}):\n{listed(fixed)}\n"
            "These cannot change within a run; start a new run directory to change them"
        )
    allowed = {name.strip() for name in allow_change}
    refused = [c for c in differing if not any(c.field == a or c.field.startswith(a + ".") for a in allowed)]
    if refused:
        flags = " ".join(f"--allow-change {c.field}" for c in refused)
        raise ValueError(
            f"--resume continues the recorded recipe ({where}), and these fields differ from it:\n"
            f"{listed(refused)}\nDrop these overrides to continue unchanged, or pass {flags} to change them from "
            f"the resumed step on (recorded in {run_dir / CHANGES_FILE}; config.yaml is kept as first written)"
        )
    return differing


def record_changes(run_dir: Path, changes: list[Change], step: int) -> None:
    """Append permitted recipe changes to the run's history, with the step they take effect after."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    history = read_changes(run_dir) + [
        {"after_step": step, "field": c.field, "from": c.recorded, "to": c.now, "time": when} for c in changes
    ]
    write_json_atomic(run_dir / CHANGES_FILE, history)
    for c in changes:
        print(
            f"--resume: {c.field} changed from {c.recorded!r} to {c.now!r} after step {step} (--allow-change)",
            flush=True,
        )


def check_data(data_dir: Path, info: DistInfo) -> None:
    """Shards against the manifest before training: sizes always, sha256 and token ids too when the dataset
    is small enough to hash in a few seconds (``verify_dataset(hashes="auto")``); a damaged dataset is refused."""
    check = verify_dataset(data_dir, hashes="auto") if info.is_main else None
    if any_rank(check is not None and not check.ok, info.device):
        detail = (
            check.format() if check is not None else f"{data_dir}: damaged (see the main process's message)"
        )
        raise ValueError(
            f"data.dir {detail}\nPrepare the dataset again (tablefree data prepare) or restore its files"
        )


def restore_checkpoint(
    checkpoint: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: TokenLoader,
    manifest: dict[str, Any],
    run_plan: Plan,
) -> TrainState:
    """Restore a run's model, optimizer, RNG and loader from ``checkpoint``; its TrainState. A damaged
    checkpoint is a CheckpointError naming the file (``_resume`` then tries the one before)."""
    recorded = checkpoints.read_meta(checkpoint).get("tokenizer_hash")
    if recorded != manifest.get("tokenizer_hash"):  # damage to skip, like any other (check_dataset vouched)
        raise checkpoints.CheckpointError(
            f"{checkpoint / META_FILE}: tokenizer {str(recorded)[:12]}…, not the dataset's "
            f"{str(manifest.get('tokenizer_hash'))[:12]}…"
        )
    saved = checkpoints.load_for_resume(
        checkpoint, model, optimizer, loader, tokenizer_hash=manifest.get("tokenizer_hash")
    )
    where = checkpoint / checkpoints.TRAIN_STATE_FILE
    state = TrainState.from_state_dict(saved, where=str(where))
    # batch_tokens never changes within a run, so these three numbers must agree
    if state.tokens_seen != state.step * run_plan.tokens_per_step:
        raise checkpoints.CheckpointError(
            f"{where}: {state.tokens_seen} tokens seen in {state.step} steps of {run_plan.tokens_per_step} tokens"
        )
    if loader.position != state.step * run_plan.grad_accum:
        raise checkpoints.CheckpointError(
            f"{where}: the loader is at micro-step {loader.position}, not at step {state.step}'s "
            f"{state.step * run_plan.grad_accum}"
        )
    return state


def check_dataset(run_dir: Path, manifest: dict[str, Any], data_dir: Path) -> None:
    """Resuming onto a dataset tokenized differently from the run's is refused, naming both datasets: when no
    checkpoint records the dataset's tokenizer (a newest one that alone differs is damage: _resume skips it)."""
    verified = []
    for checkpoint in reversed(checkpoints.complete_checkpoints(run_dir)):
        try:
            checkpoints.verify_digests(checkpoint, only=(META_FILE,))
            verified.append((checkpoint, checkpoints.read_meta(checkpoint)))
        except checkpoints.CheckpointError:
            continue  # a damaged meta.json: _resume reports it
    if any(meta.get("tokenizer_hash") == manifest.get("tokenizer_hash") for _, meta in verified):
        return
    for checkpoint, meta in verified[:1]:
        trained = meta.get("tokenizer_hash")
        if trained != manifest.get("tokenizer_hash"):
            raise ValueError(
                f"--resume: the dataset {data_dir} (tokenizer {str(manifest.get('tokenizer_hash'))[:12]}…, "
                f"{manifest.get('vocab_size')} tokens) is not tokenized like the one this run was trained on "
                f"({meta.get('data_dir')}, tokenizer {str(trained)[:12]}…, per {checkpoint / META_FILE}); "
                f"resume with data.dir={meta.get('data_dir')}, or a dataset prepared with that tokenizer"
            )
        return


def peak_memory_gb(device: torch.device) -> float:
    """Peak CUDA memory allocated, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux


def describe_run(
    config: TrainConfig,
    model_config: ModelConfig,
    run_plan: Any,
    info: DistInfo,
    breakdown: Any,
    flops_token: int,
    run_dir: Path,
    precision: Decision,
    compiled: Decision,
    ceiling: Ceiling,
    memory: Decision,
) -> None:
    print(
        f"tablefree train: {config.model.preset} / {model_config.interface.name} interface, seed {config.seed}\n"
        f"  params: {breakdown.total_trainable:,} trainable ({breakdown.non_embedding:,} non-embedding, "
        f"{breakdown.input_interface:,} in the input interface)\n"
        f"  steps: {run_plan.total_steps:,} × {run_plan.tokens_per_step:,} tokens = "
        f"{human(run_plan.total_tokens)} tokens; seq_len {run_plan.seq_len}, micro_batch "
        f"{run_plan.micro_batch} × world {run_plan.world_size} × grad_accum {run_plan.grad_accum}\n"
        f"  device: {info.device} ({config.parallel if info.world_size > 1 else 'single process'}); "
        f"{flops_token / 1e6:.1f} MFLOP/token; MFU against {ceiling.describe()}\n"
        f"  precision: {precision.value} ({precision.reason})\n"
        f"  compile: {'on' if compiled.value else 'off'} ({compiled.reason})\n"
        f"  memory: {memory.reason}\n"
        f"  run dir: {run_dir}",
        flush=True,
    )


def human(value: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def format_seconds(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
