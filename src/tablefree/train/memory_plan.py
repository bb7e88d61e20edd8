"""The memory plan of a launch: the per-GPU peak of one training step, before anything is allocated.

``estimate_memory(model_config, train_config, shape)`` runs the real training step of the real model (``build_model``,
``parallelize``'s activation checkpointing, ``build_optimizer``, the model's own loss, gradient clipping) on fake
tensors (``FakeTensorMode``: shapes and dtypes, no storage), with ``torch.distributed._tools.mem_tracker.MemTracker``
counting every tensor alive at each op, as torchtitan's memory estimation does. The peak is split into parameters,
gradients, optimizer state, activations, the logits and loss (everything after the last block: final norm, head,
loss, and their gradients) and transients (the backward's temporaries; under FSDP also the unsharded layers).

How the trace stands for a GPU (docs/distributed.md, "Memory plan"):

- **Attention.** The trace runs on the CPU device, where ``scaled_dot_product_attention`` with ``is_causal`` takes
  ``_scaled_dot_product_flash_attention_for_cpu``: like the GPU's flash kernel it keeps the output and a
  (B, H, T) logsumexp, never the (B, H, T, T) scores. The trace checks that this kernel ran (``check_attention``),
  so a torch whose CPU path fell back to the math kernel would overstate attention by O(T²) and is refused.
- **Layers.** Every block has the same shapes, so the bytes at the peak grow by the same amount per block: a model
  deeper than ``TRACED_LAYERS[-1]`` is traced at 2 and 3 blocks and each category extrapolated linearly to its
  depth (per phase, forward/backward and optimizer step, and the larger taken).
- **Precision.** DDP and one process: fp32 parameters under bf16 autocast (CPU autocast casts the same matmuls to
  bf16 as CUDA autocast). FSDP2: the step is traced with the parameters in the compute dtype (as FSDP2 unshards
  them); each gradient is dropped once accumulated (FSDP2 reduce-scatters it away); then the resident state is
  FSDP2's: fp32 parameters, gradients and AdamW moments divided by the world size, plus the unsharded transient:
  the root group (input interface, final norm, head: never resharded between forward and backward) and two blocks
  (the current one and the prefetched next) in the compute dtype, the root group's unsharded gradients (reduced
  once the backward ends) and one block's unsharded gradients with their fp32 copy for the reduce-scatter.
- **Not counted.** The CUDA context, NCCL and cuBLAS workspaces and the caching allocator's fragmentation: the
  verdict keeps ``HEADROOM`` of the device for them. ``torch.compile`` usually keeps less than the eager step
  traced here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from tablefree.config_parsing import parse_bytes
from tablefree.interfaces import ids_checked_by_caller
from tablefree.model import build_model
from tablefree.model_config import ModelConfig
from tablefree.train.optimizer import build_optimizer
from tablefree.train.parallelize import DistInfo, parallelize
from tablefree.train.recipe import TrainConfig, plan

# The verdict keeps this fraction of the device free for what the trace does not see (CUDA context, NCCL and
# cuBLAS workspaces, allocator fragmentation).
HEADROOM = 0.10
# A deeper model is traced at these depths and extrapolated (every block has the same shapes).
TRACED_LAYERS = (2, 3)
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "logits_loss", "transient")
LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "logits_loss": "logits and loss",
    "transient": "transient",
}
FLASH_ATTENTION_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@dataclass(frozen=True)
class LaunchShape:
    """What a launch decides per GPU: the world size, the micro-batch, the sequence length, activation
    checkpointing, the compute precision (``bf16`` | ``fp32``), the parallelism (``ddp`` | ``fsdp``) and the
    micro-steps per optimizer step (a second micro-step backpropagates with the first one's gradients held)."""

    gpus: int
    micro_batch: int
    seq_len: int
    activation_checkpointing: bool
    precision: str
    parallel: str
    grad_accum: int = 1

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.micro_batch < 1 or self.seq_len < 1 or self.grad_accum < 1:
            raise ValueError(
                f"launch shape: gpus, micro_batch, seq_len and grad_accum must be >= 1, got {self.describe()}"
            )
        if self.precision not in ("bf16", "fp32"):
            raise ValueError(f"precision: expected bf16 or fp32 for a memory plan, got {self.precision!r}")
        if self.parallel not in ("ddp", "fsdp"):
            raise ValueError(f"parallel: expected ddp or fsdp, got {self.parallel!r}")

    def describe(self) -> str:
        checkpointing = "with" if self.activation_checkpointing else "without"
        return (
            f"{self.parallel} over {self.gpus} GPU{'s' if self.gpus > 1 else ''}, micro-batch {self.micro_batch} "
            f"x {self.seq_len} tokens, {self.precision}, {checkpointing} activation checkpointing"
        )


@dataclass(frozen=True)
class MemoryEstimate:
    """The per-GPU peak of one training step, in bytes, split by what holds it."""

    shape: LaunchShape
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    logits_loss: int
    transient: int
    phase: str  # where the peak falls: "forward/backward" or "optimizer step"
    trainable_parameters: int
    traced_layers: tuple[int, ...]  # the depths traced (the model's own, or TRACED_LAYERS extrapolated)
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return sum(getattr(self, name) for name in CATEGORIES)

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            **{f"{name}_bytes": getattr(self, name) for name in CATEGORIES},
            "phase": self.phase,
            "shape": dataclasses.asdict(self.shape),
            "trainable_parameters": self.trainable_parameters,
            "traced_layers": list(self.traced_layers),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Verdict:
    fits: bool
    device_memory: int
    usable: int  # the device memory less HEADROOM
    fix: str | None  # the cheapest change that fits, when it does not

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def format_bytes(count: int) -> str:
    if abs(count) < 2**30:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------------------------------------
# the trace


class _StepTracker:
    """MemTracker plus what the plan needs from it: the breakdown at the peak of each phase (not only the overall
    one), the bytes after the last block (logits and loss) separated from the rest, and no per-module statistics
    (their update at every op is what makes the plain tracker slow on a large model)."""

    def __init__(self) -> None:
        # torch's private tracker modules, imported where used: they differ between torch versions, and
        # tracer_available must be able to load this module to say what is missing
        from torch.distributed._tools.common_utils import get_untyped_storages
        from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

        owner = self

        class Tracker(MemTracker):
            def _track(self, reftype: Any, t: torch.Tensor) -> None:
                if owner.after_last_block and reftype in (_MemRefType.ACT, _MemRefType.TEMP):
                    for storage in get_untyped_storages(t):
                        if storage not in self._WINFO:
                            owner.head_storages[storage] = True
                super()._track(reftype, t)

            def _update_peak_stats(self, peak_state: Any) -> None:
                owner.update_peaks()

        self.kinds = _MemRefType
        self.tracker = Tracker()
        self.after_last_block = False
        from torch.utils.weak import WeakIdKeyDictionary

        self.head_storages: Any = WeakIdKeyDictionary()
        self.peaks: dict[str, dict[str, int]] = {}

    def update_peaks(self) -> None:
        tracker = self.tracker
        snapshot = tracker._curr_mem_snap.get(torch.device("cpu"))
        if not snapshot:
            return
        phase = "optimizer step" if tracker._in_opt else "forward/backward"
        total = snapshot["Total"]
        if total <= self.peaks.get(phase, {}).get("total", -1):
            return
        kinds = self.kinds
        head = {kinds.ACT: 0, kinds.TEMP: 0}
        for storage in list(self.head_storages):
            info, _ = tracker._WINFO.get(storage, (None, None))
            if info is not None and info.reftype in head:
                head[info.reftype] += info.mem_consumed
        self.peaks[phase] = {
            "total": total,
            "parameters": snapshot[kinds.PARAM] + snapshot[kinds.BUFFER],
            "gradients": snapshot[kinds.GRAD],
            "optimizer_state": snapshot[kinds.OPT],
            "activations": snapshot[kinds.ACT] - head[kinds.ACT],
            "logits_loss": head[kinds.ACT] + head[kinds.TEMP],
            "transient": snapshot[kinds.TEMP] - head[kinds.TEMP] + snapshot[kinds.OTH],
        }

    def watch_last_block(self, block: nn.Module) -> None:
        """Everything allocated after the last block's forward, until the backward reaches that block's output,
        is the logits and loss (whatever the loss does: a chunked loss included)."""

        def entered_head(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            self.after_last_block = True
            if output.requires_grad:
                output.register_hook(left_head)

        def left_head(grad: torch.Tensor) -> None:
            self.after_last_block = False

        block.register_forward_hook(entered_head)


class _OpsSeen(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def trace_step(
    model_config: ModelConfig, train_config: TrainConfig, shape: LaunchShape
) -> dict[str, dict[str, int]]:
    """The breakdown at the peak of each phase of one training step of ``model_config`` (at its own depth) on
    fake tensors: ``{"forward/backward": {...}, "optimizer step": {...}}`` (FSDP: the first only)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fsdp = shape.parallel == "fsdp"
    bf16 = shape.precision == "bf16"
    device = torch.device("cpu")
    steps = _StepTracker()
    ops = _OpsSeen()
    # built on the meta device, as the trainer does for FSDP2 (an interface computes its fixed state from real
    # numbers, which fake tensors cannot give), then given fake storage on the CPU
    model = build_model(model_config, seed=0, device="meta")
    with FakeTensorMode():
        # FSDP2's unsharded parameters are in the compute dtype
        _fake_storage(model, device, torch.bfloat16 if fsdp and bf16 else None)
        info = DistInfo(rank=0, local_rank=0, world_size=1, device=device)
        train_model = parallelize(model, info, activation_checkpointing=shape.activation_checkpointing)
        optimizer = None
        if fsdp:  # FSDP2 reduce-scatters each gradient away once accumulated: its share is counted below
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.register_post_accumulate_grad_hook(_drop_grad)
        else:  # AdamW's moments as they are from the second step on
            optimizer = build_optimizer(model, train_config)
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.grad = torch.zeros_like(parameter)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        steps.watch_last_block(model.layers[-1])
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16) if bf16 and not fsdp else contextlib.nullcontext()
        )
        tracker = steps.tracker
        tracker.track_external(model, *([optimizer] if optimizer is not None else []))
        micro_steps = min(shape.grad_accum, 2)
        with tracker, ops, warnings.catch_warnings():
            # MemTracker's own gradient hook then finds the gradient that _drop_grad took: nothing to count
            warnings.filterwarnings("ignore", message="Expected a tensor or a traceable wrapper-subclass")
            for _ in range(micro_steps):
                size = (shape.micro_batch, shape.seq_len)
                inputs = torch.randint(0, model_config.vocab_size, size, device=device)
                targets = torch.randint(0, model_config.vocab_size, size, device=device)
                with autocast, ids_checked_by_caller():
                    loss = train_model.loss(inputs, targets)
                (loss / micro_steps).backward()
                del loss, inputs, targets
                tracker.reset_mod_stats()
            if optimizer is not None:
                torch.nn.utils.clip_grad_norm_(train_model.parameters(), train_config.optim.grad_clip or 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    check_attention(ops.ops)
    return {phase: {k: v for k, v in peak.items() if k != "total"} for phase, peak in steps.peaks.items()}


def _fake_storage(model: nn.Module, device: torch.device, parameter_dtype: torch.dtype | None) -> None:
    """Replace a meta-device model's parameters and buffers by (fake) tensors of the same shapes on ``device``,
    the parameters in ``parameter_dtype`` when given."""
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                dtype = parameter_dtype or parameter.dtype
                tensor = torch.empty(parameter.shape, dtype=dtype, device=device)
                module._parameters[name] = nn.Parameter(tensor, requires_grad=parameter.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)


def _drop_grad(parameter: torch.Tensor) -> None:
    parameter.grad = None


def check_attention(ops: set[str]) -> None:
    """Refuse a trace whose attention did not take the flash kernel (it would count O(T²) scores a GPU never
    keeps)."""
    if (
        any("scaled_dot_product" in op or "_safe_softmax" in op for op in ops)
        and FLASH_ATTENTION_OP not in ops
    ):
        raise RuntimeError(
            f"memory plan: attention did not run {FLASH_ATTENTION_OP} in the trace (torch {torch.__version__}), so "
            "it would count the (B, H, T, T) scores that the GPU's flash attention never keeps"
        )


def _extrapolated(
    model_config: ModelConfig, train_config: TrainConfig, shape: LaunchShape
) -> tuple[dict[str, dict[str, int]], tuple[int, ...]]:
    depth = model_config.n_layers
    low, high = TRACED_LAYERS
    if depth <= high:
        return trace_step(model_config, train_config, shape), (depth,)
    at_low = trace_step(replace(model_config, n_layers=low), train_config, shape)
    at_high = trace_step(replace(model_config, n_layers=high), train_config, shape)
    peaks = {}
    for phase in at_high:
        a, b = at_low.get(phase, {}), at_high[phase]
        peaks[phase] = {k: b[k] + (depth - high) * (b[k] - a.get(k, 0)) for k in b}
    return peaks, (low, high)


def estimate_memory(
    model_config: ModelConfig, train_config: TrainConfig, shape: LaunchShape
) -> MemoryEstimate:
    """The per-GPU peak of one training step of ``model_config`` under ``train_config``'s optimizer at
    ``shape`` (see the module docstring for what is traced and what is derived)."""
    peaks, traced = _extrapolated(model_config, train_config, shape)
    trainable = _trainable_parameters(model_config)
    notes = [
        "attention: the flash kernel's output and (B, H, T) logsumexp, never the (B, H, T, T) scores",
        f"not counted: the CUDA context, NCCL and cuBLAS workspaces, allocator fragmentation "
        f"(the verdict keeps {HEADROOM:.0%} of the device for them); torch.compile usually keeps less",
    ]
    if len(traced) == 2:
        notes.append(f"traced at {traced[0]} and {traced[1]} blocks, extrapolated to {model_config.n_layers}")
    if shape.parallel == "fsdp":
        peaks = {"forward/backward": _fsdp_resident(peaks["forward/backward"], model_config, shape)}
        notes.append(
            f"FSDP2: fp32 parameters, gradients and AdamW moments / {shape.gpus}; transient: the root group "
            "(input, final norm, head) and two blocks unsharded, the root's unsharded gradients and one "
            "block's with their fp32 reduce-scatter copy"
        )
    elif shape.gpus > 1:
        peaks = {phase: _ddp_buckets(peak, trainable) for phase, peak in peaks.items()}
        notes.append("DDP: its gradient buckets (a second fp32 copy of the gradients) counted as gradients")
    phase, peak = max(peaks.items(), key=lambda item: sum(item[1].values()))
    return MemoryEstimate(
        shape=shape,
        **{name: int(peak[name]) for name in CATEGORIES},
        phase=phase,
        trainable_parameters=trainable,
        traced_layers=traced,
        notes=tuple(notes),
    )


def _trainable_parameters(model_config: ModelConfig) -> int:
    model = build_model(model_config, device="meta")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _group_sizes(model_config: ModelConfig) -> tuple[int, int, int, int]:
    """(all parameters, the root group's: input, final norm and head, one block's), in elements, and the bytes of
    the buffers (the input interface's fixed state, which FSDP2 does not shard)."""
    model = build_model(replace(model_config, n_layers=1), device="meta")
    block = sum(p.numel() for p in model.layers[0].parameters())
    root = sum(p.numel() for p in model.parameters()) - block
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return root + model_config.n_layers * block, root, block, buffers


def _fsdp_resident(peak: dict[str, int], model_config: ModelConfig, shape: LaunchShape) -> dict[str, int]:
    total, root, block, buffers = _group_sizes(model_config)
    trainable = _trainable_parameters(model_config)
    compute = 2 if shape.precision == "bf16" else 4
    unsharded = (root + 2 * block) * compute
    unsharded_grads = root * compute + block * (compute + 4)
    return {
        "parameters": -(-total * 4 // shape.gpus) + buffers,
        "gradients": -(-trainable * 4 // shape.gpus),
        "optimizer_state": -(-trainable * 8 // shape.gpus),
        "activations": peak["activations"],
        "logits_loss": peak["logits_loss"],
        "transient": peak["transient"] + peak["gradients"] + unsharded + unsharded_grads,
    }


def _ddp_buckets(peak: dict[str, int], trainable: int) -> dict[str, int]:
    return {**peak, "gradients": peak["gradients"] + trainable * 4}


# ----------------------------------------------------------------------------------------------------------
# the verdict and the fix


def judge(estimate: MemoryEstimate, device_memory: int) -> Verdict:
    """Whether the estimate fits ``device_memory`` less ``HEADROOM`` (the fix is filled by ``plan_memory``)."""
    usable = int(device_memory * (1 - HEADROOM))
    return Verdict(fits=estimate.peak_bytes <= usable, device_memory=device_memory, usable=usable, fix=None)


def cheapest_fix(
    model_config: ModelConfig, train_config: TrainConfig, shape: LaunchShape, usable: int
) -> str:
    """The cheapest change that fits: a smaller micro-batch without activation checkpointing (the same tokens per
    step, a little less throughput), else activation checkpointing (about a third more compute per step) at the
    largest micro-batch that fits, else FSDP over more GPUs."""
    candidates: list[LaunchShape] = []
    micro_batch = shape.micro_batch // 2
    while micro_batch >= 1:
        candidates.append(replace(shape, micro_batch=micro_batch, grad_accum=max(shape.grad_accum, 2)))
        micro_batch //= 2
    if not shape.activation_checkpointing:
        micro_batch = shape.micro_batch
        while micro_batch >= 1:
            candidates.append(replace(shape, micro_batch=micro_batch, activation_checkpointing=True))
            micro_batch //= 2
    for candidate in candidates:
        estimate = estimate_memory(model_config, train_config, candidate)
        if estimate.peak_bytes <= usable:
            changes = []
            if candidate.micro_batch != shape.micro_batch:
                changes.append(f"micro_batch={candidate.micro_batch}")
            if candidate.activation_checkpointing != shape.activation_checkpointing:
                changes.append("activation_checkpointing=true")
            return f"{' '.join(changes)} (estimated {format_bytes(estimate.peak_bytes)})"
    more = "parallel=fsdp over more GPUs" if shape.parallel == "ddp" else "FSDP over more GPUs"
    return f"nothing at this world size fits, even micro_batch=1 with activation checkpointing: {more}"


@dataclass(frozen=True)
class MemoryPlan:
    """An estimate, and the verdict for a device memory when one is known."""

    estimate: MemoryEstimate
    verdict: Verdict | None
    model: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            **self.estimate.as_dict(),
            "verdict": None if self.verdict is None else self.verdict.as_dict(),
        }

    def format(self) -> str:
        estimate = self.estimate
        lines = [
            f"memory plan: {self.model}, {estimate.trainable_parameters:,} trainable parameters",
            f"launch: {estimate.shape.describe()}",
            f"per-GPU peak ({estimate.phase}): {estimate.peak_bytes:,} bytes ({format_bytes(estimate.peak_bytes)})",
        ]
        for name in CATEGORIES:
            value = getattr(estimate, name)
            lines.append(f"  {LABELS[name]:<18} {value:>18,}  {format_bytes(value):>11}")
        lines += [f"  note: {note}" for note in estimate.notes]
        verdict = self.verdict
        if verdict is None:
            lines.append("verdict: no device memory known (no GPU visible): pass --device-memory, e.g. 80GiB")
        elif verdict.fits:
            lines.append(
                f"verdict: fits {format_bytes(verdict.device_memory)} (peak {format_bytes(estimate.peak_bytes)} "
                f"<= {format_bytes(verdict.usable)} usable, {HEADROOM:.0%} kept free)"
            )
        else:
            lines.append(
                f"verdict: does NOT fit {format_bytes(verdict.device_memory)} (peak "
                f"{format_bytes(estimate.peak_bytes)} > {format_bytes(verdict.usable)} usable); cheapest fix: "
                f"{verdict.fix}"
            )
        return "\n".join(lines)


def plan_memory(
    model_config: ModelConfig,
    train_config: TrainConfig,
    shape: LaunchShape,
    device_memory: int | None,
    model_name: str = "",
) -> MemoryPlan:
    """The estimate for ``shape`` and, with a device memory, the verdict (and the cheapest fix when it does not
    fit)."""
    estimate = estimate_memory(model_config, train_config, shape)
    verdict = None
    if device_memory is not None:
        verdict = judge(estimate, device_memory)
        if not verdict.fits:
            verdict = replace(verdict, fix=cheapest_fix(model_config, train_config, shape, verdict.usable))
    return MemoryPlan(estimate, verdict, model_name or f"d_model {model_config.d_model}")


def launch_shape(
    config: TrainConfig,
    model_config: ModelConfig,
    gpus: int,
    precision: str,
    grad_accum: int | None = None,
) -> LaunchShape:
    """The launch shape of ``config`` on ``gpus`` processes at ``precision`` (resolved: bf16 or fp32); the
    micro-steps per optimizer step come from the recipe's plan unless given."""
    if grad_accum is None:
        grad_accum = plan(config, model_config, gpus).grad_accum
    return LaunchShape(
        gpus=gpus,
        micro_batch=config.micro_batch,
        seq_len=config.seq_len or model_config.max_seq_len,
        activation_checkpointing=config.activation_checkpointing,
        precision=precision,
        parallel=config.parallel,
        grad_accum=grad_accum,
    )


def device_memory_to_check(setting: str, device: torch.device, report: bool = True) -> int | None:
    """The device memory ``train`` checks the plan against (its ``device_memory`` field): ``auto`` is the GPU's
    total memory and nothing on a CPU, ``off`` nothing, a size (``80GiB``) that size on any device.

    Where this torch cannot trace the plan (``tracer_available``), ``auto`` says so (when ``report``) and checks
    nothing; an explicit size is an error."""
    if setting == "off" or (setting == "auto" and device.type != "cuda"):
        return None
    available, reason = tracer_available()
    if not available:
        if setting != "auto":
            raise ValueError(f"device_memory={setting}: the memory plan cannot be traced here ({reason})")
        if report:
            print(f"memory plan: not checked ({reason}; device_memory=off silences this)", flush=True)
        return None
    if setting == "auto":
        return torch.cuda.get_device_properties(device).total_memory
    return parse_bytes(setting, "device_memory")


def tracer_available() -> tuple[bool, str]:
    """Whether this torch has the MemTracker internals the trace hooks into, and if not, what is missing."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401
        from torch.distributed._tools.common_utils import get_untyped_storages  # noqa: F401
        from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType  # noqa: F401
    except ImportError as error:
        return False, f"torch {torch.__version__} has no {error.name or error}"
    needed = ("_track", "_update_peak_stats", "track_external", "reset_mod_stats")
    missing = [name for name in needed if not hasattr(MemTracker, name)]
    if missing:
        return False, f"torch {torch.__version__}'s MemTracker has no {', '.join(missing)}"
    return True, "MemTracker"


def refuse_if_too_large(
    model_config: ModelConfig, config: TrainConfig, shape: LaunchShape, device_memory: int
) -> MemoryEstimate:
    """The estimate for ``shape``; a ``ValueError`` naming the numbers and the cheapest fix when it does not fit
    ``device_memory``."""
    memory_plan = plan_memory(model_config, config, shape, device_memory)
    verdict = memory_plan.verdict
    estimate = memory_plan.estimate
    if verdict is not None and not verdict.fits:
        parts = ", ".join(f"{LABELS[name]} {format_bytes(getattr(estimate, name))}" for name in CATEGORIES)
        raise ValueError(
            f"the memory plan does not fit: {shape.describe()} needs an estimated "
            f"{format_bytes(estimate.peak_bytes)} per GPU ({parts}), more than the "
            f"{format_bytes(verdict.usable)} usable of device_memory {format_bytes(device_memory)} "
            f"({HEADROOM:.0%} kept free); cheapest fix: {verdict.fix}. `tablefree memory --config ...` shows the "
            "plan; device_memory=off skips this check"
        )
    return estimate


def describe_fit(estimate: MemoryEstimate, device_memory: int) -> str:
    """One line: the estimated peak against the device memory."""
    return (
        f"{format_bytes(estimate.peak_bytes)} per GPU estimated ({estimate.phase}), within the "
        f"{format_bytes(judge(estimate, device_memory).usable)} usable of {format_bytes(device_memory)}"
    )


def visible_device_memory() -> int | None:
    """The total memory of the visible GPU (the first one), or None without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return None
