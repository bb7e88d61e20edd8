"""What a run reports: ``metrics.jsonl`` (and TensorBoard), the console lines, and the FLOPs behind MFU.

``metrics.jsonl`` holds one JSON object per line: train records (step, tokens, train_loss, lr, grad_norm,
tokens_per_s, tflops, mfu, elapsed_s), skipped-update records (step, tokens, skipped_update, loss, grad_norm,
lr) and validation-estimate records (step, tokens, val_loss_estimate, val_windows). The in-training estimate
is named ``val_loss_estimate`` everywhere, apart from the evaluation over the whole validation split
(``tablefree eval``), a different number.
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tablefree import cpu_threads
from tablefree.fileio import strict_json, write_text_atomic, writing
from tablefree.hardware import Ceiling
from tablefree.model_config import ModelConfig
from tablefree.params import ParamBreakdown, param_breakdown
from tablefree.precision import Decision
from tablefree.rundir import RUN_FILES, read_jsonl
from tablefree.train.optimizer import describe_optimizer
from tablefree.train.parallelize import DistInfo
from tablefree.train.recipe import Plan, TrainConfig
from tablefree.units import human

METRICS_FILE = RUN_FILES["metrics"]
TENSORBOARD_DIR = "tensorboard"


def flops_per_token(model_config: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token, as torchtitan's ``get_num_flop_per_token`` (pytorch/torchtitan,
    torchtitan/utils.py): 6·N for the matmuls of forward + backward over the N non-embedding parameters (the
    output head included, the input interface excluded, so all three interfaces count the same), plus
    12·L·H·hd·T for attention scores and values (2 matmuls forward, 4 backward, 2 FLOPs per multiply-add;
    causal sparsity not discounted)."""
    non_embedding = param_breakdown(model_config).non_embedding
    c = model_config
    return 6 * non_embedding + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len


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

                self.tensorboard = SummaryWriter(str(run_dir / TENSORBOARD_DIR))
            except ImportError:
                pass

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = strict_json(record)
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


def truncate_metrics(path: Path, after_step: int) -> None:
    """Drop records past ``after_step`` (left by a process killed after its last checkpoint), atomically; a torn
    last line goes too (``rundir.read_jsonl``'s one rule), and an old bare NaN becomes null."""
    if not path.exists():
        return
    kept = [record for record in read_jsonl(path) if record.get("step", 0) <= after_step]
    write_text_atomic(path, "".join(json.dumps(strict_json(r), allow_nan=False) + "\n" for r in kept))


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


class StepLog:
    """Each step into metrics.jsonl and onto the console: a record and a progress line every ``log_every`` steps
    (and at the last step), throughput over the steps since the previous line; a tqdm bar on a terminal."""

    def __init__(
        self,
        metrics: MetricsLog,
        run_plan: Plan,
        log_every: int,
        flops_token: int,
        peak_flops: float,
        info: DistInfo,
        start_step: int,
    ) -> None:
        self.metrics, self.plan, self.log_every, self.info = metrics, run_plan, log_every, info
        self.flops_per_token, self.peak_flops = flops_token, peak_flops
        self.interval_s, self.interval_steps = 0.0, 0
        self.progress = tqdm(
            total=run_plan.total_steps,
            initial=start_step,
            unit="step",
            dynamic_ncols=True,
            disable=not (info.is_main and sys.stderr.isatty()),
        )

    def should_log(self, step: int) -> bool:
        """A train record and a progress line after this step: every ``log_every`` steps, and at the last."""
        return step % self.log_every == 0 or step == self.plan.total_steps

    def log(self, result: StepResult, elapsed_s: float) -> None:
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
        elif self.should_log(result.step):
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
                    "elapsed_s": elapsed_s,
                }
            )
            eta = (total_steps - result.step) * self.interval_s / self.interval_steps
            self.progress.set_postfix_str(
                f"loss {result.loss:.4f} | {human(result.tokens, 2)} tok | {human(tokens_per_s, 2)} tok/s | "
                f"{tflops:.3g} TFLOP/s, MFU {100 * mfu:.1f}%",
                refresh=False,
            )
            if self.info.is_main and self.progress.disable:
                print(
                    f"step {result.step}/{total_steps} | loss {result.loss:.4f} | lr {result.lr:.2e} | "
                    f"{human(result.tokens, 2)} tok | {human(tokens_per_s, 2)} tok/s | {tflops:.3g} TFLOP/s, "
                    f"MFU {100 * mfu:.1f}% | "
                    f"ETA {format_seconds(eta)}",
                    flush=True,
                )
            self.interval_s, self.interval_steps = 0.0, 0
        self.progress.update(1)

    def close(self) -> None:
        self.progress.close()


def describe_run(
    config: TrainConfig,
    model_config: ModelConfig,
    run_plan: Plan,
    info: DistInfo,
    breakdown: ParamBreakdown,
    flops_token: int,
    run_dir: Path,
    precision: Decision,
    compiled: Decision,
    ceiling: Ceiling,
    memory: Decision,
    optimizer: torch.optim.Optimizer,
) -> None:
    """The lines a run starts with: what is trained, on what, how."""
    print(
        f"tablefree train: {config.model.preset} / {model_config.interface.name} interface, seed {config.seed}\n"
        f"  params: {breakdown.total_trainable:,} trainable ({breakdown.non_embedding:,} non-embedding, "
        f"{breakdown.input_interface:,} in the input interface)\n"
        f"  steps: {run_plan.total_steps:,} × {run_plan.tokens_per_step:,} tokens = "
        f"{human(run_plan.total_tokens, 2)} tokens; seq_len {run_plan.seq_len}, micro_batch "
        f"{run_plan.micro_batch} × world {run_plan.world_size} × grad_accum {run_plan.grad_accum}\n"
        f"  device: {info.device} ({config.parallel if info.world_size > 1 else 'single process'}); "
        f"{flops_token / 1e6:.1f} MFLOP/token; MFU against {ceiling.describe()}\n"
        f"  precision: {precision.value} ({precision.reason})\n"
        f"  compile: {'on' if compiled.value else 'off'} ({compiled.reason})\n"
        f"  memory: {memory.reason}\n"
        f"  optimizer: {describe_optimizer(optimizer)}\n"
        f"  threads: {cpu_threads.describe()}\n"
        f"  run dir: {run_dir}",
        flush=True,
    )


def describe_end(summary: dict[str, Any], val_windows: int, run_dir: Path) -> str:
    """One closing line; an interrupted run says so and shows only the numbers it has."""
    parts = [f"step {summary['step']}/{summary['total_steps']}", f"{summary['tokens_seen']:,} tokens"]
    if summary["final_train_loss"] is not None:
        parts.append(f"train loss {summary['final_train_loss']:.4f}")
    if summary["final_val_loss_estimate"] is not None:
        parts.append(f"val loss estimate ({val_windows} windows) {summary['final_val_loss_estimate']:.4f}")
    parts.append(f"{human(summary['tokens_per_s'], 2)} tok/s")
    head = "done" if summary["completed"] else f"stopped ({summary['stop_reason']})"
    return f"{head}: {', '.join(parts)} -> {run_dir}"


def peak_memory_gb(device: torch.device) -> float:
    """Peak CUDA memory allocated, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux


def format_seconds(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
