"""What ``precision: auto`` and ``compile: auto`` become on the device at hand, and why.

- ``precision: auto`` is bf16 autocast where the device multiplies bf16 natively and faster (CUDA GPUs with
  bf16 support; CPUs that advertise AVX-512 BF16, AMX or Arm BF16, pass a tiny runtime check that a bf16
  matmul runs and agrees with fp32, and whose measured bf16 matmul ceiling is at least ``BF16_MIN_SPEEDUP``
  times the fp32 one; see ``tablefree.hardware``), fp32 elsewhere. Parameters, gradients and optimizer state stay fp32;
  the loss is computed in fp32. On a CPU without native bf16, autocast would emulate it and run slower.
- ``compile: auto`` compiles the transformer blocks when a compiler backend is present (a C++ compiler for
  inductor on CPU, Triton on CUDA) and the run is long enough to repay the compilation: compiling costs
  about ``COMPILE_COST_S`` once and saves about ``COMPILE_SAVING`` of each step, so it pays when the run's
  estimated eager time exceeds ``COMPILE_COST_S / COMPILE_SAVING``. Short runs (tests, the demo, the
  20-step sweeps) stay eager.

Every decision carries a one-line reason that the trainer prints, so a run says what it chose.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from typing import Any

import torch

from tablefree import hardware

PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_CHOICES = ("auto", True, False)

# bf16 autocast must beat fp32 matmuls by this factor to be chosen: the casts cost something, and some CPUs
# advertise avx512_bf16 yet multiply bf16 more slowly than fp32 (seen on a VM whose host hid AMX).
BF16_MIN_SPEEDUP = 1.2

# Measured with benchmarks/train_throughput.py on 2 cores (docs/benchmarks.md): compiling the blocks of `small`
# (forward + backward) takes tens of seconds on a CPU; compiled steps are 20-25% faster in bf16.
COMPILE_COST_S = {"cpu": 60.0, "cuda": 90.0}
COMPILE_SAVING = 0.2
# The fraction of the measured matmul ceiling an eager training step reaches, for the run-time estimate.
EAGER_MFU_ESTIMATE = 0.3


@dataclass(frozen=True)
class Decision:
    value: Any  # "fp32" | "bf16" for precision; True | False for compile
    reason: str


def autocast_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under ``precision`` (what the MFU ceiling is measured for)."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


# ----------------------------------------------------------------------------------------------------------
# precision


def choose_precision(requested: str, device: torch.device) -> Decision:
    """``requested`` (auto | fp32 | bf16) resolved for ``device``."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {requested!r}")
    if requested != "auto":
        return Decision(requested, "as configured")
    native, detail = auto_may_pick_bf16(device)
    if not native:
        return Decision("fp32", f"auto: {detail}")
    if device.type == "cuda":
        return Decision("bf16", f"auto: {detail}")
    fp32 = hardware.peak_flops(device, torch.float32)
    bf16 = hardware.peak_flops(device, torch.bfloat16)
    rates = f"bf16 {hardware.format_flops(bf16.flops)} vs fp32 {hardware.format_flops(fp32.flops)} measured"
    if bf16.flops < BF16_MIN_SPEEDUP * fp32.flops:
        return Decision("fp32", f"auto: {detail}, but it is not faster here ({rates})")
    return Decision("bf16", f"auto: {detail}; {rates}")


def auto_may_pick_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``precision: auto`` can choose bf16 on ``device`` at all (before comparing measured rates), and
    why: where it cannot, its bf16 ceiling is never needed, so nothing measures it."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return True, f"{name} has native bf16"
        return False, f"{name} has no native bf16"
    if device.type != "cpu":
        return False, f"auto is fp32 on {device.type}"
    return cpu_native_bf16()


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> tuple[bool, str]:
    """Whether this CPU multiplies bf16 natively (feature flags plus a runtime check), with the evidence."""
    flags = hardware.cpu_bf16_flags()
    if not flags:
        return False, "this CPU has no native bf16 matmul (no avx512_bf16, amx_bf16 or bf16 flag)"
    if not torch.backends.mkldnn.is_available():
        return False, f"the CPU has {'+'.join(flags)} but this torch build has no oneDNN to use it"
    if not hardware.bf16_matmul_is_accurate(torch.device("cpu")):
        return False, f"the CPU has {'+'.join(flags)} but a bf16 matmul failed its runtime check"
    return True, f"the CPU has native bf16 matmul ({'+'.join(flags)}; runtime check passed)"


# ----------------------------------------------------------------------------------------------------------
# compile


def choose_compile(
    requested: bool | str,
    device: torch.device,
    *,
    estimated_eager_s: float | None = None,
) -> Decision:
    """``requested`` (auto | true | false) resolved for ``device`` and a run expected to take
    ``estimated_eager_s`` seconds without compiling (None: unknown, which does not compile under auto).

    An explicit ``true`` without a compiler backend is an error that says what is missing."""
    if requested not in COMPILE_CHOICES:
        raise ValueError(f"compile: expected auto, true or false, got {requested!r}")
    if requested is False:
        return Decision(False, "as configured")
    available, detail = compiler_available(device)
    if requested is True:
        if not available:
            raise ValueError(
                f"compile: true, but torch.compile cannot run here: {detail}; set compile: false"
            )
        return Decision(True, "as configured")
    if not available:
        return Decision(False, f"auto: off, torch.compile cannot run here ({detail}); training runs eagerly")
    cost = COMPILE_COST_S.get(device.type, COMPILE_COST_S["cuda"])
    break_even = cost / COMPILE_SAVING
    if estimated_eager_s is None:
        return Decision(False, "auto: off, the run's length is unknown")
    if estimated_eager_s < break_even:
        return Decision(
            False,
            f"auto: off, the run (~{estimated_eager_s:.0f} s eager) is shorter than compiling repays "
            f"(~{break_even:.0f} s)",
        )
    return Decision(
        True, f"auto: on, the run (~{estimated_eager_s:.0f} s eager) repays ~{cost:.0f} s of compilation"
    )


def estimate_eager_seconds(total_flops: float, ceiling_flops: float) -> float:
    """A run's eager duration from its model FLOPs and the device's measured ceiling."""
    return total_flops / (ceiling_flops * EAGER_MFU_ESTIMATE)


@functools.lru_cache(maxsize=4)
def compiler_available(device: torch.device) -> tuple[bool, str]:
    """Whether torch.compile's default backend (inductor) can generate code for ``device``."""
    # Private torch modules, imported here: they may be missing from a torch version, and inductor is slow to
    # import for a module every verb loads
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            return False, "this torch has no Triton support"
        return (True, "Triton found") if has_triton() else (False, "Triton is not installed")
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        compiler = get_cpp_compiler()
    except Exception as error:  # any failure here means inductor cannot build CPU kernels
        return False, f"no C++ compiler for inductor ({error}); install g++ or set CXX"
    if shutil.which(compiler) is None:
        return False, f"the C++ compiler {compiler!r} is not on PATH; install g++ or set CXX"
    return True, f"C++ compiler {compiler}"
