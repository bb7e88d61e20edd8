"""The training loop: ``train(config, run_dir, resume=False) -> summary``.

``Trainer`` does one run: set up (``__init__``), ``train_step``, ``validate``, ``save``, ``summary``, strung
together by ``run``; everything that changes from step to step lives in one ``TrainState``.

One optimizer step = ``grad_accum`` micro-steps of ``micro_batch`` sequences on each of ``world_size``
processes = ``batch_tokens`` tokens. A run directory holds::

    config.yaml      # the resolved TrainConfig (model fields filled in from the preset and the dataset)
    metrics.jsonl    # one JSON object per line: train records (step, tokens, train_loss, lr, grad_norm,
                     #   tokens_per_s, tflops, mfu, elapsed_s) and validation records (step, tokens, val_loss)
    summary.json     # tokens_seen, wall_time_s, tokens_per_s, final_train_loss, final_val_loss, params, ...
    checkpoints/step_XXXXXXXX/   # see tablefree.train.checkpointing
    tensorboard/     # when the tensorboard package is installed

Determinism: the backbone of every interface is initialised identically for one seed (per-parameter-name
seeding in ``TablefreeLM.init_weights``), and batches depend only on (seed, step) through ``TokenLoader``.
Nothing else draws random numbers, so a resumed fp32 CPU run reproduces an uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from tablefree.checkpoint import META_FILE
from tablefree.config import ModelConfig, load_yaml, to_dict
from tablefree.data.loader import TokenLoader, read_manifest
from tablefree.fileio import read_json, write_json_atomic, write_text_atomic
from tablefree.hardware import Ceiling, datasheet_bf16_flops
from tablefree.hardware import peak_flops as measured_peak_flops
from tablefree.interfaces import check_token_ids, ids_checked_by_caller
from tablefree.model import build_model, next_token_loss
from tablefree.params import param_breakdown
from tablefree.train import checkpointing, sharded
from tablefree.train.config import ModelSpec, TrainConfig, lr_at, plan
from tablefree.train.parallelize import (
    DistInfo,
    all_reduce_mean,
    any_rank,
    barrier,
    destroy_distributed,
    init_distributed,
    parallelize,
)
from tablefree.train.precision import (
    Decision,
    autocast_dtype,
    choose_compile,
    choose_precision,
    estimate_eager_seconds,
)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
# Fault injection for the exact-resume test: the process SIGKILLs itself after this optimizer step.
KILL_AFTER_STEP_ENV = "TABLEFREE_FAULT_KILL_AFTER_STEP"


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite; the run stopped before updating the model."""

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
    # Fused (one kernel over all tensors) on CUDA, and on the CPU for plain fp32 parameters: on 2 CPU threads it
    # takes a quarter of the default per-tensor loop's time (21 vs 80 ms per step for `small`); sharded CPU
    # parameters (FSDP2 under gloo) keep the default.
    params = decay + no_decay
    on_cuda = any(p.device.type == "cuda" for p in params)
    plain_cpu = all(
        type(p) is torch.nn.Parameter and p.dtype == torch.float32 and p.device.type == "cpu" for p in params
    )
    return torch.optim.AdamW(
        groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=on_cuda or plain_cpu
    )


def resolved_config(config: TrainConfig, model_config: ModelConfig, seq_len: int) -> TrainConfig:
    """The config with every model field and the sequence length filled in (what config.yaml records)."""
    model_fields = {k: v for k, v in to_dict(model_config).items() if k != "interface"}
    spec = ModelSpec(preset=config.model.preset, interface=model_config.interface, **model_fields)
    return replace(config, model=spec, seq_len=seq_len)


def train(config: TrainConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Train a model; returns the summary (also written to ``run_dir/summary.json``).

    ``resume=True`` continues from the newest complete checkpoint in ``run_dir`` (or starts afresh when there
    is none). Launched under torchrun, the processes share the work with DDP or FSDP2 (``config.parallel``).
    """
    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = init_distributed(config.device, force_process_group=config.parallel == "fsdp")
    try:
        return Trainer(config, Path(run_dir), resume, info).run()
    finally:
        if owns_process_group:  # leave a caller's process group alone
            destroy_distributed()


@dataclass
class TrainState:
    """What the loop carries from step to step, and what a checkpoint's ``train_state.pt`` restores besides the
    optimizer, the random generators and the loader position (torchtitan's ``TrainState``)."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0
    wall_time_s: float = 0.0  # across resumes
    train_time_s: float = 0.0  # training steps only (no validation, no checkpointing), across resumes
    last_train_loss: float | None = None
    last_val_loss: float | None = None
    best_val_loss: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any]) -> TrainState:
        """The fields this version knows; keys of older checkpoints (``schedule``, ``world_size``) are ignored."""
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's numbers, for the log."""

    loss: float
    grad_norm: float
    lr: float
    seconds: float


class Trainer:
    """One training run: ``setup`` (in ``__init__``), ``train_step``, ``validate``, ``save``, ``summary``; ``run``
    strings them together. Everything that changes from step to step is in ``self.state``."""

    def __init__(self, config: TrainConfig, run_dir: Path, resume: bool, info: DistInfo) -> None:
        self.started = time.perf_counter()
        self.info, self.run_dir, self.device = info, run_dir, info.device

        # data, model config and the run's numbers
        self.data_dir = Path(config.data.dir)
        self.manifest = read_manifest(self.data_dir)
        self.model_config = config.model.build(
            dataset_vocab_size=int(self.manifest["vocab_size"]), seed=config.seed
        )
        self.plan = plan(config, self.model_config, info.world_size)
        self.config = config = resolved_config(config, self.model_config, self.plan.seq_len)
        self.breakdown = param_breakdown(self.model_config)
        self.flops_per_token = flops_per_token(self.model_config, self.plan.seq_len)
        self.precision_choice = choose_precision(config.precision, self.device)
        self.precision = self.precision_choice.value
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

        self.resumed_from = self._check_run_dir(resume)
        self._build_model_and_data()
        self.state = TrainState()
        if self.resumed_from is not None:
            self._load_checkpoint(self.resumed_from)
        self.prior_wall_s = self.state.wall_time_s
        self.start_step = self.state.step
        self.saved_at = -1
        self._write_run_files()

    # ---- setup

    def _check_run_dir(self, resume: bool) -> Path | None:
        """The checkpoint to resume from (None: a fresh start); a fresh run must not overwrite another run."""
        run_dir = self.run_dir
        checkpoint = checkpointing.latest_checkpoint(run_dir) if resume else None
        if not resume and ((run_dir / METRICS_FILE).exists() or checkpointing.complete_checkpoints(run_dir)):
            raise FileExistsError(
                f"{run_dir} already holds a run; pass --resume to continue it, or choose another --run-dir"
            )
        if checkpoint is not None:
            check_resumable(run_dir, checkpoint, self.config, self.manifest)
        barrier()  # every process has checked before rank 0 writes anything
        return checkpoint

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
        self.val_loader = TokenLoader.from_dir(
            self.data_dir, "val", self.plan.seq_len, config.micro_batch, shuffle=False, **loader_args
        )
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16" and config.parallel != "fsdp"  # FSDP2 casts parameters itself
            else contextlib.nullcontext()
        )

    def _load_checkpoint(self, checkpoint: Path) -> None:
        saved = checkpointing.load_train_state(checkpoint)
        if sharded.is_sharded(checkpoint):  # each rank reads its own shards, at any world size
            sharded.load_sharded(checkpoint, self.train_model, self.optimizer)
        else:
            checkpointing.restore(
                self.train_model,
                self.optimizer,
                checkpointing.load_model_state(checkpoint),
                saved["optimizer"],
            )
        checkpointing.set_rng_state(saved["rng"])
        self.train_loader.load_state_dict(saved["loader"])
        self.state = TrainState.from_state_dict(saved)

    def _write_run_files(self) -> None:
        """config.yaml, metrics.jsonl cut back to the resumed step, and the run's description."""
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
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
        stop_reason = "completed"
        self.train_model.train()
        try:
            with stop.installed():
                while state.step < total_steps:
                    self.log_step(self.train_step())
                    if (
                        self.config.val_every
                        and state.step % self.config.val_every == 0
                        and state.step < total_steps
                    ):
                        self.validate()
                    stopping = any_rank(stop.requested is not None, self.device)
                    if (
                        self.config.checkpoint_every and state.step % self.config.checkpoint_every == 0
                    ) or stopping:
                        self.save()
                    if stopping:
                        stop_reason = f"stopped by {stop.requested or 'a signal on another process'}"
                        if self.info.is_main:
                            print(
                                f"\n{stop_reason} after step {state.step}; checkpoint saved. Continue with --resume.",
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
            and self.state.last_val_loss is not None
        )

    def train_step(self) -> StepResult:
        """One optimizer step of ``grad_accum`` micro-steps; a non-finite loss stops before the update."""
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
        train_loss = all_reduce_mean(loss_sum / run_plan.grad_accum).item()

        if not math.isfinite(train_loss):
            self.optimizer.zero_grad(set_to_none=True)
            last = checkpointing.latest_checkpoint(self.run_dir)
            raise NonFiniteLossError(
                f"step {step}: the training loss is {train_loss}; stopped without updating the model. "
                + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet."),
                stop_reason=f"non-finite loss at step {step}",
            )

        max_norm = self.config.optim.grad_clip if self.config.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.train_model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        seconds = time.perf_counter() - step_start
        state.step = step
        state.tokens_seen += run_plan.tokens_per_step
        state.train_time_s += seconds
        state.last_train_loss = train_loss
        return StepResult(loss=train_loss, grad_norm=float(grad_norm), lr=lr, seconds=seconds)

    def log_step(self, result: StepResult) -> None:
        """A metrics record and a progress line every ``log_every`` steps (and at the last step)."""
        state, total_steps = self.state, self.plan.total_steps
        self.interval_s += result.seconds
        self.interval_steps += 1
        if state.step % self.config.log_every == 0 or state.step == total_steps:
            tokens_per_s = self.interval_steps * self.plan.tokens_per_step / max(self.interval_s, 1e-9)
            tflops = self.flops_per_token * tokens_per_s / self.info.world_size / 1e12  # achieved, per device
            mfu = tflops * 1e12 / self.peak_flops
            self.metrics.write(
                {
                    "step": state.step,
                    "tokens": state.tokens_seen,
                    "train_loss": result.loss,
                    "lr": result.lr,
                    "grad_norm": result.grad_norm,
                    "tokens_per_s": tokens_per_s,
                    "tflops": tflops,
                    "mfu": mfu,
                    "elapsed_s": self.wall_time_s(),
                }
            )
            eta = (total_steps - state.step) * self.interval_s / self.interval_steps
            self.progress.set_postfix_str(
                f"loss {result.loss:.4f} | {human(state.tokens_seen)} tok | {human(tokens_per_s)} tok/s | "
                f"{tflops:.3g} TFLOP/s, MFU {100 * mfu:.1f}%",
                refresh=False,
            )
            if self.info.is_main and self.progress.disable:
                print(
                    f"step {state.step}/{total_steps} | loss {result.loss:.4f} | lr {result.lr:.2e} | "
                    f"{human(state.tokens_seen)} tok | {human(tokens_per_s)} tok/s | {tflops:.3g} TFLOP/s, "
                    f"MFU {100 * mfu:.1f}% | "
                    f"ETA {format_seconds(eta)}",
                    flush=True,
                )
            self.interval_s, self.interval_steps = 0.0, 0
        self.progress.update(1)

    def validate(self) -> float:
        """The validation loss now (recorded in the state and metrics.jsonl)."""
        state = self.state
        val_loss = validation_loss(
            self.train_model, self.val_loader, self.config.val_batches, self.device, self.autocast
        )
        state.last_val_loss = val_loss
        if state.best_val_loss is None or val_loss < state.best_val_loss:
            state.best_val_loss = val_loss
        self.metrics.write({"step": state.step, "tokens": state.tokens_seen, "val_loss": val_loss})
        return val_loss

    # ---- checkpoints and summaries

    def wall_time_s(self) -> float:
        return self.prior_wall_s + time.perf_counter() - self.started

    def save(self) -> Path | None:
        """A checkpoint of the current step (a collective: every process calls it; rank 0 writes)."""
        state = self.state
        state.wall_time_s = self.wall_time_s()
        if self.sharded_checkpoints:  # every rank writes its shards into the staging directory first
            staging = checkpointing.staging_dir(self.run_dir, state.step)
            if self.info.is_main:
                shutil.rmtree(staging, ignore_errors=True)  # left over from a process killed while saving
            barrier()
            sharded.save_sharded(staging, self.train_model, self.optimizer)
            model_state, optim_state = None, {"in": sharded.SHARDED_DIR}
        else:
            model_state, optim_state = checkpointing.full_state(self.train_model, self.optimizer)
        path = None
        if self.info.is_main:
            train_state = {
                **state.state_dict(),
                "optimizer": optim_state,
                "rng": checkpointing.rng_state(),
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
                "val_loss": state.last_val_loss,
            }
            path = checkpointing.save_checkpoint(
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
            "final_val_loss": state.last_val_loss,
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
            write_json_atomic(self.run_dir / SUMMARY_FILE, summary)

    def _print_done(self, summary: dict[str, Any]) -> None:
        if not self.info.is_main:
            return
        state = self.state
        val = state.last_val_loss
        print(
            f"done: step {state.step}, {state.tokens_seen:,} tokens, train loss {state.last_train_loss:.4f}, val loss "
            f"{val if val is None else round(val, 4)}, "
            f"{human(summary['tokens_per_s'])} tok/s -> {self.run_dir}",
            flush=True,
        )


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
    """Mean loss over the first ``val_batches × micro_batch`` windows of the val split, whatever the world
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
        self.handle.write(json.dumps(record) + "\n")
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


def truncate_metrics(path: Path, after_step: int) -> None:
    """Drop records past ``after_step`` (left by a process killed after its last checkpoint), atomically."""
    if not path.exists():
        return
    kept = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # only the last line can be cut short by a kill
                continue
            raise ValueError(f"{path}:{number}: not a JSON record ({error})") from error
        if record.get("step", 0) <= after_step:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def check_resumable(run_dir: Path, checkpoint: Path, config: TrainConfig, manifest: dict[str, Any]) -> None:
    """Resuming must not silently change the experiment: same model, seed, batch, data and tokenizer."""
    saved_path = run_dir / CONFIG_FILE
    if not saved_path.exists():
        return
    saved = load_yaml(saved_path)
    current = to_dict(config)
    for key in ("model", "seed", "batch_tokens", "seq_len", "data"):
        if saved.get(key) != current.get(key):
            raise ValueError(
                f"--resume: {key} differs from {saved_path} ({saved.get(key)!r} there, {current.get(key)!r} "
                "now); start a new run directory to change it"
            )
    meta = read_json(checkpoint / META_FILE)
    if meta.get("tokenizer_hash") != manifest.get("tokenizer_hash"):
        raise ValueError(
            f"--resume: the dataset's tokenizer hash {manifest.get('tokenizer_hash')} differs from the "
            f"checkpoint's {meta.get('tokenizer_hash')} ({checkpoint / META_FILE})"
        )


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
