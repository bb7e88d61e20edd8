"""The training loop: ``train(config, run_dir, resume=False, allow_change=()) -> summary``.

``Trainer`` does one run: set up (``__init__``), ``train_step``, ``validate``, ``save``, ``summary``, strung
together by ``run``; everything that changes from step to step lives in one ``TrainState``. Setup hands off to
the components, read top to bottom: the dataset (``data.loader.Dataset``), the run directory's policy
(``resume``: lock, recipe changes, dataset checks), the model and its parallelisation (``parallelize``), the
optimizer (``optimizer``), the validation estimate (``validate.Validator``), the checkpoints
(``checkpoints.Checkpointer``, over the format of ``tablefree.checkpoint``) and what the run reports
(``metrics``). The loop does not decide when to validate, save or log: it asks the component that does
(``validator.should_validate``, ``checkpointer.should_save``, ``step_log.should_log``, ``stop.should_agree``).

One optimizer step = ``grad_accum`` micro-steps of ``micro_batch`` sequences on each of ``world_size``
processes = ``batch_tokens`` tokens. A run directory holds::

    config.yaml          # the resolved TrainConfig (model fields filled in from the preset and the dataset)
    config_changes.json  # recipe changes allowed on resume (train.resume)
    metrics.jsonl        # train and validation-estimate records (train.metrics)
    summary.json         # tokens_seen, wall_time_s, tokens_per_s, final_train_loss, final_val_loss_estimate, ...
    checkpoints/step_XXXXXXXX/   # see tablefree.checkpoint
    tensorboard/         # when the tensorboard package is installed

Determinism: the backbone of every interface is initialised identically for one seed (per-parameter-name
seeding in ``TablefreeLM.init_weights``), and batches depend only on (seed, step) through ``TokenLoader``.
Nothing else draws random numbers, so a resumed fp32 CPU run reproduces an uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import yaml

from tablefree.checkpoint.layout import complete_checkpoints, latest_checkpoint
from tablefree.config_parsing import to_dict
from tablefree.cpu_memory import keep_freed_memory
from tablefree.data.loader import Dataset
from tablefree.fileio import strict_json, write_json_atomic, write_text_atomic
from tablefree.hardware import datasheet_bf16_flops
from tablefree.hardware import peak_flops as measured_peak_flops
from tablefree.interfaces import check_token_ids, ids_checked_by_caller
from tablefree.model import build_model
from tablefree.model_config import ModelConfig
from tablefree.params import param_breakdown
from tablefree.precision import autocast_dtype, choose_compile, choose_precision, estimate_eager_seconds
from tablefree.rundir import RUN_FILES
from tablefree.train.checkpoints import Checkpointer
from tablefree.train.faults import StepHook, hooks_from_environment
from tablefree.train.memory_plan import (
    describe_fit,
    device_memory_to_check,
    launch_shape,
    refuse_if_too_large,
)
from tablefree.train.metrics import (
    MetricsLog,
    StepLog,
    StepResult,
    describe_end,
    describe_run,
    flops_per_token,
    peak_memory_gb,
    truncate_metrics,
)
from tablefree.train.optimizer import build_optimizer
from tablefree.train.parallelize import (
    DistInfo,
    all_reduce_mean,
    any_rank,
    destroy_distributed,
    init_distributed,
    parallelize,
)
from tablefree.train.recipe import ModelSpec, TrainConfig, lr_at, plan
from tablefree.train.resume import (
    Change,
    RunDirLock,
    check_run_dir,
    nothing_to_resume,
    record_changes,
    verify_dataset_matches_run,
    verify_dataset_on_all_ranks,
)
from tablefree.train.state import NonFiniteLossError, PendingStep, TrainState
from tablefree.train.validate import Validator

CONFIG_FILE = RUN_FILES["config"]
METRICS_FILE = RUN_FILES["metrics"]
SUMMARY_FILE = RUN_FILES["summary"]
# with several processes, a stop signal is agreed on at least this often (and at every log, validation and save)
STOP_CHECK_STEPS = 10


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
        resume = bool(complete_checkpoints(run_dir))
    elif resume and not complete_checkpoints(run_dir):
        raise FileNotFoundError(nothing_to_resume(run_dir))
    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = init_distributed(config.device, force_process_group=config.parallel == "fsdp")
    try:
        with RunDirLock(run_dir, info):
            return Trainer(config, run_dir, bool(resume), info, allow_change).run()
    finally:
        if owns_process_group:  # leave a caller's process group alone
            destroy_distributed()


def resolved_config(config: TrainConfig, model_config: ModelConfig, seq_len: int) -> TrainConfig:
    """The config with every model field and the sequence length filled in (what config.yaml records)."""
    model_fields = {k: v for k, v in to_dict(model_config).items() if k != "interface"}
    spec = ModelSpec(preset=config.model.preset, interface=model_config.interface, **model_fields)
    return replace(config, model=spec, seq_len=seq_len)


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
        self.dataset = self._checked_dataset(config, resume)
        self.config = config = self._plan(config)
        changes = check_run_dir(run_dir, config, resume, allow_change, info)  # fresh, or the allowed changes
        self._build_model()
        # the components that decide when to validate, save and stop, built once
        self.validator = Validator(self.dataset, config, self.plan, info, self.train_model, self.autocast)
        self.checkpointer = Checkpointer(
            run_dir=run_dir,
            config=config,
            model_config=self.model_config,
            dataset=self.dataset,
            model=self.model,
            train_model=self.train_model,
            optimizer=self.optimizer,
            loader=self.train_loader,
            run_plan=self.plan,
            info=info,
        )
        self.stop = StopSignal(info.world_size, self.device)
        # test-only fault injection
        self.step_hooks: list[StepHook] = hooks_from_environment(lambda: self.stop.requested is not None)
        self._restore_state(resume, changes)
        # the run's files and what it reports
        self._write_run_files()
        self.metrics = MetricsLog(run_dir, enabled=info.is_main)
        self._describe()
        self.step_log = StepLog(
            self.metrics,
            self.plan,
            config.log_every,
            self.flops_per_token,
            self.ceiling.flops,
            info,
            start_step=self.state.step,
        )

    def _checked_dataset(self, config: TrainConfig, resume: bool) -> Dataset:
        """The dataset, checked on every rank before anything is built."""
        dataset = Dataset.open(config.data.dir)
        verify_dataset_on_all_ranks(dataset, self.info)
        if resume:  # before the model is built: a different dataset is named as such, not as a vocab_size
            verify_dataset_matches_run(self.run_dir, dataset)
        return dataset

    def _plan(self, config: TrainConfig) -> TrainConfig:
        """The model's shape and the run's numbers (step plan, FLOPs, precision, compile); returns the recipe
        resolved against them."""
        info, dataset = self.info, self.dataset
        self.model_config = config.model.build(dataset_vocab_size=dataset.vocab_size, seed=config.seed)
        self.plan = plan(config, self.model_config, info.world_size)
        config = resolved_config(config, self.model_config, self.plan.seq_len)
        self.breakdown = param_breakdown(self.model_config)
        self.flops_per_token = flops_per_token(self.model_config, self.plan.seq_len)
        self.precision = choose_precision(config.precision, self.device)
        # the memory plan, before anything is measured or allocated: a launch that cannot fit the device stops here
        device_memory = device_memory_to_check(config.device_memory, self.device, info.is_main)
        if device_memory is not None:
            shape = launch_shape(
                config, self.model_config, info.world_size, self.precision.value, self.plan.grad_accum
            )
            estimate = refuse_if_too_large(self.model_config, config, shape, device_memory)
            if info.is_main:
                print(f"memory plan: {describe_fit(estimate, device_memory)}", flush=True)
        self.memory = keep_freed_memory(self.device)
        # MFU's ceiling: the measured matmul rate of the dtype in use on this device (cached per machine).
        self.ceiling = measured_peak_flops(
            self.device, autocast_dtype(self.precision.value), override=config.peak_flops
        )
        run_flops = self.flops_per_token * self.plan.total_tokens / info.world_size
        self.compile = choose_compile(
            config.compile,
            self.device,
            estimated_eager_s=estimate_eager_seconds(run_flops, self.ceiling.flops),
        )
        return config

    def _build_model(self) -> None:
        """The model, its parallel wrapper, the optimizer, the training loader and the autocast context."""
        config, info = self.config, self.info
        # FSDP2: built on the meta device; parallelize() materialises only this rank's shards.
        self.model = build_model(
            self.model_config, seed=config.seed, device="meta" if config.parallel == "fsdp" else self.device
        )
        self.train_model = parallelize(
            self.model,
            info,
            parallel=config.parallel,
            compile=self.compile.value,
            activation_checkpointing=config.activation_checkpointing,
            param_dtype=torch.bfloat16 if self.precision.value == "bf16" else None,
            seed=config.seed,
        )
        self.optimizer = build_optimizer(self.model, config)
        self.train_loader = self.dataset.loader(
            "train",
            self.plan.seq_len,
            config.micro_batch,
            shuffle=config.data.shuffle,
            holdout_every=config.data.select_every,
            seed=config.seed,
            rank=info.rank,
            world_size=info.world_size,
        )
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision.value == "bf16" and config.parallel != "fsdp"  # FSDP2 casts parameters itself
            else contextlib.nullcontext()
        )

    def _restore_state(self, resume: bool, changes: list[Change]) -> None:
        """The state: fresh, or resumed from the newest checkpoint that loads; the recipe changes recorded."""
        resumed = self.checkpointer.resume() if resume else None
        self.resumed_from = resumed.checkpoint if resumed else None
        self.state = resumed.state if resumed else TrainState()
        self.state.halted = torch.zeros((), dtype=torch.bool, device=self.device)  # on_nonfinite: stop
        if changes and self.info.is_main:
            record_changes(self.run_dir, changes, self.state.step)
        self.prior_wall_s = self.state.wall_time_s
        self.start_step = self.state.step

    def _describe(self) -> None:
        """The run's description on the console (main process), and where it resumed from."""
        if not self.info.is_main:
            return
        describe_run(
            self.config,
            self.model_config,
            self.plan,
            self.info,
            self.breakdown,
            self.flops_per_token,
            self.run_dir,
            self.precision,
            self.compile,
            self.ceiling,
            self.memory,
            self.optimizer,
        )
        if self.resumed_from is not None:
            print(
                f"resumed from {self.resumed_from} (step {self.state.step}, {self.state.tokens_seen:,} tokens)",
                flush=True,
            )

    def _write_run_files(self) -> None:
        """config.yaml (a resumed run keeps its recorded recipe; changes go to config_changes.json) and
        metrics.jsonl cut back to the resumed step."""
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # A run that starts from another run's checkpoint (a budget branch of `compare`) has no recorded
            # recipe yet and records its own.
            if self.resumed_from is None or not (self.run_dir / CONFIG_FILE).exists():
                write_text_atomic(
                    self.run_dir / CONFIG_FILE, yaml.safe_dump(to_dict(self.config), sort_keys=False)
                )
            truncate_metrics(self.run_dir / METRICS_FILE, after_step=self.state.step)

    # ---- the loop

    def run(self) -> dict[str, Any]:
        """Train to the end of the budget (or a stop signal); write and return the summary."""
        state, total_steps = self.state, self.plan.total_steps
        stop_reason = "completed"
        self.train_model.train()
        try:
            with self.stop.installed():
                while state.step < total_steps:
                    state.pending.append(self.train_step())
                    step = state.step
                    validating = self.validator.should_validate(step)
                    saving = self.checkpointer.should_save(step)
                    # the steps' losses stay on the device until a step that needs them (a read point)
                    reading = (
                        validating
                        or saving
                        or self.step_log.should_log(step)
                        or self.stop.should_agree(step)
                        or any(hook.needs_read(step) for hook in self.step_hooks)
                    )
                    if reading:  # before anything is validated or saved: a NaN step stops here
                        self.read_steps()
                    stopping = self.stop.agreed(at_read_point=reading)
                    if stopping:
                        self.read_steps()
                    if validating:
                        self.validate()
                    if saving or stopping:
                        self.save()
                    if stopping:
                        stop_reason = f"stopped by {self.stop.requested or 'a signal on another process'}"
                        self._print_stopped(stop_reason)
                        break
                    for hook in self.step_hooks:
                        hook.after_step(step)

            completed = state.step >= total_steps and stop_reason == "completed"
            if completed and not self._resumed_a_finished_run():
                self.validate()
                if self.checkpointer.saved_step != state.step:
                    self.save()
        except NonFiniteLossError as error:
            self._write_summary(self.summary(completed=False, stop_reason=error.stop_reason))
            raise
        finally:
            self.step_log.close()
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
                loss = self.train_model(inputs, targets=targets)  # ids checked in device_batch; chunked loss
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
            state.halted |= bad
            bad = state.halted
        # per group: a loaded optimizer state brings its groups' settings (an older run's foreach included)
        if all(group.get("fused") for group in self.optimizer.param_groups):
            self.optimizer.found_inf = bad.float()  # the fused kernel skips the update and its step count
            self.optimizer.step()
            del self.optimizer.found_inf  # as a gradient scaler does: no later step() sees a stale flag
        elif self.config.on_nonfinite == "stop" or not bad.item():
            # No device-side skip here, and reading the flag would make the host wait every step. Under `stop` the
            # update is applied and the run stops at the next read, before anything is validated or saved, so no
            # poisoned weights are kept; only `skip` must read the flag before each update.
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
        pending, self.state.pending = self.state.pending, []
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
            self.step_log.log(
                StepResult(entry.step, entry.tokens, loss, norm, entry.lr, entry.seconds, skipped=not finite),
                elapsed_s=self.wall_time_s(),
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
        last = latest_checkpoint(self.run_dir)
        raise NonFiniteLossError(
            f"step {step}: {what}; stopped without updating the model. "
            + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet.")
            + (
                self._first_step_causes() if step == 1 else " (on_nonfinite=skip skips such updates instead.)"
            ),
            stop_reason=f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step}",
        )

    def _first_step_causes(self) -> str:
        """Why a first step fails: the initial weights and the inputs, not the updates (skipping every update
        would train nothing), so name the settings that size them."""
        interface = self.model_config.interface
        sizes = [
            f"model.interface.{option}={getattr(interface, option):g} ({interface.name})"
            for option in ("scale", "sigma")
            if isinstance(getattr(interface, option, None), float | int)
        ]
        settings = ", ".join(
            [*sizes, f"model.init_std={self.model_config.init_std:g}", f"precision={self.precision.value}"]
        )
        return (
            " At step 1 the model is still its initialisation, so the settings that size its inputs and weights "
            f"fail: check {settings} (optim.lr={self.config.optim.lr:g} has not acted yet: no update comes before "
            "step 1's loss). on_nonfinite=skip would skip every update."
        )

    def validate(self) -> float:
        """The validation-loss estimate now (``Validator.estimate``), recorded in the state and metrics.jsonl as
        ``val_loss_estimate``."""
        state = self.state
        estimate = self.validator.estimate()
        state.last_val_loss_estimate = estimate
        if state.best_val_loss_estimate is None or estimate < state.best_val_loss_estimate:
            state.best_val_loss_estimate = estimate
        self.metrics.write(
            {
                "step": state.step,
                "tokens": state.tokens_seen,
                "val_loss_estimate": estimate,
                "val_windows": self.validator.windows,
            }
        )
        return estimate

    # ---- checkpoints and summaries

    def wall_time_s(self) -> float:
        return self.prior_wall_s + time.perf_counter() - self.started

    def save(self) -> Path | None:
        """A checkpoint of the current step, with the wall time so far (``Checkpointer.save``: a collective)."""
        self.state.wall_time_s = self.wall_time_s()
        return self.checkpointer.save(self.state)

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
            "mfu": self.flops_per_token * tokens_per_s / (self.ceiling.flops * self.info.world_size),
            "tflops_per_device": self.flops_per_token * tokens_per_s / self.info.world_size / 1e12,
            "flops_per_token": self.flops_per_token,
            "peak_flops_per_device": self.ceiling.flops,
            "datasheet_bf16_flops_per_device": datasheet_bf16_flops(self.device),
            "peak_flops_source": {
                "source": self.ceiling.source,
                "dtype": self.ceiling.dtype,
                **self.ceiling.provenance,
            },
            "final_train_loss": state.last_train_loss,
            "final_val_loss_estimate": state.last_val_loss_estimate,
            "best_val_loss_estimate": state.best_val_loss_estimate,
            "val_estimate_windows": self.validator.windows,
            "skipped_steps": state.skipped_steps,
            "params": self.breakdown.as_dict(),
            "interface": self.model_config.interface.name,
            "seed": self.config.seed,
            "world_size": self.info.world_size,
            "device": str(self.device),
            "precision": self.precision.value,
            "precision_reason": self.precision.reason,
            "compiled": self.compile.value,
            "compile_reason": self.compile.reason,
            "grad_accum": self.plan.grad_accum,
            "peak_memory_gb": peak_memory_gb(self.device),
        }

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if self.info.is_main:
            write_json_atomic(self.run_dir / SUMMARY_FILE, strict_json(summary))

    def _print_done(self, summary: dict[str, Any]) -> None:
        if self.info.is_main:
            print(describe_end(summary, self.validator.windows, self.run_dir), flush=True)

    def _print_stopped(self, stop_reason: str) -> None:
        if self.info.is_main:
            print(
                f"\n{stop_reason} after step {self.state.step}; "
                + (
                    "no checkpoint (checkpoint_format: none)."
                    if self.config.checkpoint_format == "none"
                    else "checkpoint saved. In a sweep, re-run the same `tablefree compare` command; "
                    f"alone, continue with `tablefree train --resume --run-dir {self.run_dir}`."
                ),
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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)


class StopSignal:
    """SIGTERM/SIGINT ask the loop to save and stop after the current step; a second SIGINT interrupts.
    SIGUSR2 too: SLURM's warning before a time limit or preemption (submitit's signal; tablefree.launch).
    With several processes, a stop is agreed on by all (an all-reduce, so a host wait): only at read points, and
    at least every ``STOP_CHECK_STEPS`` steps (``should_agree``)."""

    def __init__(self, world_size: int = 1, device: torch.device | None = None) -> None:
        self.requested: str | None = None
        self.world_size, self.device = world_size, device or torch.device("cpu")

    def should_agree(self, step: int) -> bool:
        """Whether this step must be a read point for the processes to agree on a stop."""
        return self.world_size > 1 and step % STOP_CHECK_STEPS == 0

    def agreed(self, at_read_point: bool) -> bool:
        """Whether every process stops now: one process checks its own flag at every step; several agree at read
        points only."""
        return (self.world_size == 1 or at_read_point) and any_rank(self.requested is not None, self.device)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals can only be handled on the main thread
            return
        previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
