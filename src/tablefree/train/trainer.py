"""The training loop: ``train(config, run_dir, resume=False) -> summary``. Read it top to bottom.

One optimizer step = ``grad_accum`` micro-steps of ``micro_batch`` sequences on each of ``world_size``
processes = ``batch_tokens`` tokens. A run directory holds::

    config.yaml      # the resolved TrainConfig (model fields filled in from the preset and the dataset)
    metrics.jsonl    # one JSON object per line: train records (step, tokens, train_loss, lr, grad_norm,
                     #   tokens_per_s, mfu, elapsed_s) and validation records (step, tokens, val_loss)
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
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from tqdm import tqdm

from tablefree.checkpoint import META_FILE, read_json, write_json_atomic, write_text_atomic
from tablefree.config import ModelConfig, load_yaml, to_dict
from tablefree.data.loader import TokenLoader, read_manifest
from tablefree.hardware import Ceiling
from tablefree.hardware import peak_flops as measured_peak_flops
from tablefree.model import build_model
from tablefree.params import param_breakdown
from tablefree.train import checkpointing
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
    # Fused (one kernel over all tensors) where every parameter is a plain fp32 CPU or CUDA tensor: on 2 CPU
    # threads it takes a quarter of the time of the default per-tensor loop (21 vs 80 ms per step for `small`,
    # benchmarks/train_throughput.py); sharded DTensors (FSDP2) keep the default implementation.
    fused = all(
        p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") and type(p) is torch.nn.Parameter
        for group in groups
        for p in group["params"]
    )
    return torch.optim.AdamW(
        groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, fused=fused or None
    )


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


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
        return _train(config, Path(run_dir), resume, info)
    finally:
        if owns_process_group:  # leave a caller's process group alone
            destroy_distributed()


def _train(config: TrainConfig, run_dir: Path, resume: bool, info: DistInfo) -> dict[str, Any]:
    wall_start = time.perf_counter()
    device = info.device

    # ---- data, model config and the run's numbers
    data_dir = Path(config.data.dir)
    manifest = read_manifest(data_dir)
    model_config = config.model.build(dataset_vocab_size=int(manifest["vocab_size"]))
    run_plan = plan(config, model_config, info.world_size)
    config = resolved_config(config, model_config, run_plan.seq_len)
    breakdown = param_breakdown(model_config)
    flops_token = flops_per_token(model_config, run_plan.seq_len)
    precision_choice = choose_precision(config.precision, device)
    precision = precision_choice.value
    # MFU's ceiling: the measured matmul rate of the dtype in use on this device (cached per machine).
    ceiling = measured_peak_flops(device, autocast_dtype(precision), override=config.peak_flops)
    peak_flops = ceiling.flops
    eager_s = estimate_eager_seconds(flops_token * run_plan.total_tokens / info.world_size, peak_flops)
    compile_choice = choose_compile(config.compile, device, estimated_eager_s=eager_s)
    tokenizer_path = data_dir / manifest.get("tokenizer_file", "tokenizer.json")

    # ---- the run directory: a fresh run must not overwrite another run
    checkpoint = checkpointing.latest_checkpoint(run_dir) if resume else None
    if not resume and ((run_dir / METRICS_FILE).exists() or checkpointing.complete_checkpoints(run_dir)):
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it, or choose another --run-dir"
        )
    if checkpoint is not None:
        check_resumable(run_dir, checkpoint, config, manifest)
    barrier()  # every process has checked before rank 0 writes anything

    # ---- model, parallelism, optimizer, data
    model = build_model(model_config, seed=config.seed, device=device)
    param_dtype = torch.bfloat16 if precision == "bf16" else None
    train_model = parallelize(
        model,
        info,
        parallel=config.parallel,
        compile=compile_choice.value,
        activation_checkpointing=config.activation_checkpointing,
        param_dtype=param_dtype,
    )
    optimizer = build_optimizer(model, config)
    loader_args = dict(seed=config.seed, rank=info.rank, world_size=info.world_size)
    train_loader = TokenLoader.from_dir(
        data_dir, "train", run_plan.seq_len, config.micro_batch, shuffle=config.data.shuffle, **loader_args
    )
    val_loader = TokenLoader.from_dir(
        data_dir, "val", run_plan.seq_len, config.micro_batch, shuffle=False, **loader_args
    )
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16" and config.parallel != "fsdp"  # FSDP2 casts parameters itself
        else contextlib.nullcontext()
    )

    # ---- resume
    step, tokens_seen, prior_wall, prior_train_time = 0, 0, 0.0, 0.0
    last_train_loss = last_val_loss = None
    if checkpoint is not None:
        state = checkpointing.load_train_state(checkpoint)
        checkpointing.restore(
            train_model, optimizer, checkpointing.load_model_state(checkpoint), state["optimizer"]
        )
        checkpointing.set_rng_state(state["rng"])
        train_loader.load_state_dict(state["loader"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        prior_wall, prior_train_time = state["wall_time_s"], state["train_time_s"]
        last_train_loss, last_val_loss = state.get("last_train_loss"), state.get("last_val_loss")
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / CONFIG_FILE, yaml.safe_dump(to_dict(config), sort_keys=False))
        truncate_metrics(run_dir / METRICS_FILE, after_step=step)
    metrics = MetricsLog(run_dir, enabled=info.is_main)
    if info.is_main:
        describe_run(
            config,
            model_config,
            run_plan,
            info,
            breakdown,
            flops_token,
            run_dir,
            precision_choice,
            compile_choice,
            ceiling,
        )
        if checkpoint is not None:
            print(f"resumed from {checkpoint} (step {step}, {tokens_seen:,} tokens)", flush=True)

    def save(at_step: int) -> Path | None:
        model_state, optim_state = checkpointing.full_state(train_model, optimizer)
        path = None
        if info.is_main:
            train_state = {
                "step": at_step,
                "tokens_seen": tokens_seen,
                "optimizer": optim_state,
                "schedule": {"name": config.schedule.name, "step": at_step},
                "rng": checkpointing.rng_state(),
                "loader": train_loader.state_dict(),
                "wall_time_s": prior_wall + time.perf_counter() - wall_start,
                "train_time_s": prior_train_time + train_time,
                "last_train_loss": last_train_loss,
                "last_val_loss": last_val_loss,
                "world_size": info.world_size,
            }
            meta = {
                "step": at_step,
                "tokens_seen": tokens_seen,
                "tokenizer_hash": manifest.get("tokenizer_hash"),
                "data_dir": str(data_dir),
                "interface": model_config.interface.name,
                "seed": config.seed,
                "train_loss": last_train_loss,
                "val_loss": last_val_loss,
            }
            path = checkpointing.save_checkpoint(
                run_dir,
                at_step,
                model_state,
                train_state,
                {"model": to_dict(model_config), "train": to_dict(config)},
                meta,
                tokenizer_path if tokenizer_path.exists() else None,
                keep_last=config.keep_last,
            )
        barrier()
        return path

    def summarize(at_step: int, completed: bool, stop_reason: str) -> dict[str, Any]:
        total_train_time = prior_train_time + train_time
        tokens_per_s = tokens_seen / total_train_time if total_train_time > 0 else 0.0
        return {
            "completed": completed,
            "stop_reason": stop_reason,
            "step": at_step,
            "total_steps": run_plan.total_steps,
            "tokens_seen": tokens_seen,
            "wall_time_s": prior_wall + time.perf_counter() - wall_start,
            "train_time_s": total_train_time,
            "tokens_per_s": tokens_per_s,
            "mfu": flops_token * tokens_per_s / (peak_flops * info.world_size),
            "tflops_per_device": flops_token * tokens_per_s / info.world_size / 1e12,
            "flops_per_token": flops_token,
            "peak_flops_per_device": peak_flops,
            "peak_flops_source": {"source": ceiling.source, "dtype": ceiling.dtype, **ceiling.provenance},
            "final_train_loss": last_train_loss,
            "final_val_loss": last_val_loss,
            "params": breakdown.as_dict(),
            "interface": model_config.interface.name,
            "seed": config.seed,
            "world_size": info.world_size,
            "device": str(device),
            "precision": precision,
            "precision_reason": precision_choice.reason,
            "compiled": compile_choice.value,
            "compile_reason": compile_choice.reason,
            "grad_accum": run_plan.grad_accum,
            "peak_memory_gb": peak_memory_gb(device),
        }

    def write_summary(summary: dict[str, Any]) -> None:
        if info.is_main:
            write_json_atomic(run_dir / SUMMARY_FILE, summary)

    # ---- the loop
    stop = StopSignal()
    kill_after = int(os.environ.get(KILL_AFTER_STEP_ENV, "0"))
    progress = tqdm(
        total=run_plan.total_steps,
        initial=step,
        unit="step",
        dynamic_ncols=True,
        disable=not (info.is_main and sys.stderr.isatty()),
    )
    train_time = 0.0
    start_step = step
    interval_time, interval_steps = 0.0, 0
    stop_reason, saved_at = "completed", -1
    train_model.train()
    with stop.installed():
        while step < run_plan.total_steps:
            step_start = time.perf_counter()
            step += 1
            lr = lr_at(step, run_plan.total_steps, config.optim.lr, config.schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr

            loss_sum = torch.zeros((), device=device)
            for micro_step in range(run_plan.grad_accum):
                inputs, targets = next(train_loader)
                inputs = inputs.to(device, non_blocking=True)
                targets = targets.to(device, non_blocking=True)
                with gradient_sync(train_model, micro_step == run_plan.grad_accum - 1), autocast:
                    loss = cross_entropy_loss(train_model(inputs), targets)
                (loss / run_plan.grad_accum).backward()
                loss_sum += loss.detach()
            train_loss = all_reduce_mean(loss_sum / run_plan.grad_accum).item()

            if not math.isfinite(train_loss):
                optimizer.zero_grad(set_to_none=True)
                last = checkpointing.latest_checkpoint(run_dir)
                message = (
                    f"step {step}: the training loss is {train_loss}; stopped without updating the model. "
                    + (f"The last good checkpoint is {last}." if last else "No checkpoint was saved yet.")
                )
                progress.close()
                metrics.close()
                write_summary(
                    summarize(step - 1, completed=False, stop_reason=f"non-finite loss at step {step}")
                )
                raise NonFiniteLossError(message)

            max_norm = config.optim.grad_clip if config.optim.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), max_norm)
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            step_time = time.perf_counter() - step_start
            train_time += step_time
            tokens_seen += run_plan.tokens_per_step
            interval_time += step_time
            interval_steps += 1
            last_train_loss = train_loss

            if step % config.log_every == 0 or step == run_plan.total_steps:
                tokens_per_s = interval_steps * run_plan.tokens_per_step / max(interval_time, 1e-9)
                tflops = flops_token * tokens_per_s / info.world_size / 1e12  # achieved, per device
                mfu = tflops * 1e12 / peak_flops
                record = {
                    "step": step,
                    "tokens": tokens_seen,
                    "train_loss": train_loss,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "tokens_per_s": tokens_per_s,
                    "tflops": tflops,
                    "mfu": mfu,
                    "elapsed_s": prior_wall + time.perf_counter() - wall_start,
                }
                metrics.write(record)
                eta = (run_plan.total_steps - step) * interval_time / interval_steps
                progress.set_postfix_str(
                    f"loss {train_loss:.4f} | {human(tokens_seen)} tok | {human(tokens_per_s)} tok/s | "
                    f"{tflops:.3g} TFLOP/s, MFU {100 * mfu:.1f}%",
                    refresh=False,
                )
                if info.is_main and progress.disable:
                    print(
                        f"step {step}/{run_plan.total_steps} | loss {train_loss:.4f} | lr {lr:.2e} | "
                        f"{human(tokens_seen)} tok | {human(tokens_per_s)} tok/s | {tflops:.3g} TFLOP/s, "
                        f"MFU {100 * mfu:.1f}% | "
                        f"ETA {format_seconds(eta)}",
                        flush=True,
                    )
                interval_time, interval_steps = 0.0, 0
            progress.update(1)

            if config.val_every and step % config.val_every == 0 and step < run_plan.total_steps:
                last_val_loss = validation_loss(train_model, val_loader, config.val_batches, device, autocast)
                metrics.write({"step": step, "tokens": tokens_seen, "val_loss": last_val_loss})

            stopping = any_rank(stop.requested is not None, device)
            if (config.checkpoint_every and step % config.checkpoint_every == 0) or stopping:
                save(step)
                saved_at = step
            if stopping:
                stop_reason = f"stopped by {stop.requested or 'a signal on another process'}"
                if info.is_main:
                    print(
                        f"\n{stop_reason} after step {step}; checkpoint saved. Continue with --resume.",
                        flush=True,
                    )
                break
            if kill_after and step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

    completed = step >= run_plan.total_steps and stop_reason == "completed"
    resumed_finished_run = checkpoint is not None and step == start_step and last_val_loss is not None
    if completed and not resumed_finished_run:
        last_val_loss = validation_loss(train_model, val_loader, config.val_batches, device, autocast)
        metrics.write({"step": step, "tokens": tokens_seen, "val_loss": last_val_loss})
        if saved_at != step:
            save(step)
    progress.close()
    metrics.close()
    summary = summarize(step, completed=completed, stop_reason=stop_reason)
    write_summary(summary)
    if info.is_main:
        print(
            f"done: step {step}, {tokens_seen:,} tokens, train loss {last_train_loss:.4f}, val loss "
            f"{last_val_loss if last_val_loss is None else round(last_val_loss, 4)}, "
            f"{human(summary['tokens_per_s'])} tok/s -> {run_dir}",
            flush=True,
        )
    return summary


# --------------------------------------------------------------------------------------------------------
# Pieces of the loop


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
        per_token = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.to(device).reshape(-1), reduction="none"
        )
        per_window = per_token.view(targets.shape).mean(dim=1).double()
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
