"""What this machine can do: native bf16 support, and the measured matmul ceiling MFU is reported against.

MFU means "model FLOPs per second over the most this device reaches". A datasheet figure is a vendor's
number for an ideal kernel; a CPU has none at all (the earlier per-core guess gave "MFU 297%"). So the
ceiling here is measured: the best rate of square matmuls in the dtype the run computes in, on the device it
runs on, with the threads it uses. The record is cached per machine in ``~/.cache/tablefree/peak_flops.json``
(``$TABLEFREE_PEAK_FLOPS_CACHE`` overrides the path), keyed by device name, dtype and threads, with its
provenance (sizes, seconds, load average, torch version, time of measurement).

On a CPU each timed matmul counts the shorter of its wall time and its CPU time per thread, but a machine
shared with other work still measures low (0.18 against the idle 0.31 TFLOP/s on 2 busy cores). So the cache
keeps the best figure measured rather than the first, a record measured under load (``under_load``) is measured
again once the machine is less loaded than it was then, and a process uses one ceiling per (device, dtype,
threads) for all its MFU figures, however often it asks. A measurement stops short of the larger sizes when they
would take more than ``MAX_MEASURE_SECONDS`` (emulated bf16 on a CPU without native bf16 is that slow).

    from tablefree.hardware import peak_flops
    ceiling = peak_flops(torch.device("cpu"), torch.bfloat16)      # cached after the first call
    print(ceiling.flops / 1e12, "TFLOP/s", ceiling.provenance)

CLI: ``tablefree hardware`` (``--remeasure`` to measure again).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from tablefree.fileio import read_json, write_json_atomic

CACHE_ENV = "TABLEFREE_PEAK_FLOPS_CACHE"
DEFAULT_CACHE = "~/.cache/tablefree/peak_flops.json"
CACHE_VERSION = 1

# Square matmul sides tried per device type: large enough to reach the units' steady rate, small enough that a
# measurement costs about a second (an fp32 2048² matmul is 17 GFLOP, ~50 ms on 2 cores).
SIZES = {"cpu": (1024, 2048), "cuda": (4096, 8192)}
MIN_SECONDS_PER_SIZE = {"cpu": 0.25, "cuda": 0.2}
MIN_REPEATS = 3
# A larger size is skipped when its estimated time (from the smaller one's rate) would pass this.
MAX_MEASURE_SECONDS = 3.0
# The first size's cost is estimated from a pilot matmul this large (where a dtype is emulated, as bf16 on a CPU
# without bf16 instructions, the first size alone would take tens of seconds); when every size would pass the
# cap, the pilot is the measurement.
PILOT_SIZE = 256
# A measurement counts as taken under load when the load average then exceeded the cores its threads did not
# use by more than this.
LOAD_SLACK = 0.5

# CPU feature flags of native bf16 dot products (x86: AVX-512 BF16 and AMX; Arm: the BF16 extension).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")

# Dense bf16 datasheet peaks (no sparsity), for reference next to the measured ceiling; most specific names first.
DATASHEET_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
}

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# ----------------------------------------------------------------------------------------------------------
# Device identity and features


def device_name(device: torch.device) -> str:
    """A stable name for the cache key: the GPU's name, or the CPU's model name with its bf16 features (a
    virtual machine reports the same model name whether or not its host exposes AMX)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    flags = cpu_bf16_flags()
    return f"{cpu_model_name()} ({'+'.join(flags) if flags else 'no native bf16'})"


def datasheet_bf16_flops(device: torch.device) -> float | None:
    """The vendor's dense bf16 peak for a known GPU (None for CPUs and unknown GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in DATASHEET_BF16_FLOPS.items() if key in name), None)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags: torch's own detection (cpuinfo) where this torch has it, plus /proc/cpuinfo."""
    flags: set[str] = set()
    capability = getattr(torch._C._cpu, "_get_cpu_capability", None)  # torch >= 2.6
    if capability is not None:
        with contextlib.suppress(Exception):  # best effort; /proc/cpuinfo below still answers
            flags |= {name for name, present in capability().items() if present is True}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("flags", "features")):
                flags |= set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return flags


def cpu_bf16_flags() -> list[str]:
    """The native bf16 matmul features this CPU advertises (empty when it has none)."""
    flags = cpu_flags()
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def bf16_matmul_is_accurate(device: torch.device) -> bool:
    """A tiny runtime check that a bf16 matmul runs here and agrees with fp32 to bf16's precision (relative
    Frobenius error below 1%; bf16 rounding gives about 0.3% on a 64-wide dot product)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=generator).to(device)
    b = torch.randn(64, 64, generator=generator).to(device)
    try:
        out = a.bfloat16() @ b.bfloat16()
    except RuntimeError:
        return False
    reference = a.double() @ b.double()
    error = torch.linalg.norm(out.double() - reference) / torch.linalg.norm(reference)
    return out.dtype == torch.bfloat16 and bool(error < 1e-2)


# ----------------------------------------------------------------------------------------------------------
# The measured ceiling


@dataclass(frozen=True)
class Ceiling:
    """The best measured matmul rate of one (device, dtype, threads)."""

    flops: float  # FLOP/s
    device: str
    dtype: str
    threads: int
    source: str  # "measured" (just now), "cache" (an earlier measurement) or "override" (given by the user)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def tflops(self) -> float:
        return self.flops / 1e12

    def describe(self) -> str:
        if self.source == "override":
            return f"{format_flops(self.flops)} (given)"
        when = self.provenance.get("measured_at", "?")
        load = self.provenance.get("load_average")
        at_load = f" at load average {load:g}" if isinstance(load, (int, float)) else ""
        busy = ", under load" if under_load(self) else ""
        return f"{format_flops(self.flops)} {self.dtype} matmul, measured {when}{at_load}{busy}"


def format_flops(flops: float) -> str:
    """``0.31 TFLOP/s``, or GFLOP/s below 0.1 TFLOP/s (an emulated bf16 matmul on a CPU is not "0.00")."""
    if flops >= 1e11:
        return f"{flops / 1e12:.2f} TFLOP/s"
    return f"{flops / 1e9:.3g} GFLOP/s"


def under_load(ceiling: Ceiling) -> bool:
    """Whether ``ceiling`` was measured while other work held cores its threads needed (from its provenance; a
    GPU's figure does not depend on the host's load)."""
    if ceiling.provenance.get("device_type", "cpu") != "cpu":
        return False
    load, cores = ceiling.provenance.get("load_average"), ceiling.provenance.get("logical_cores")
    if not isinstance(load, (int, float)) or not isinstance(cores, int):
        return False
    return load > max(0, cores - ceiling.threads) + LOAD_SLACK


def load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def matmul_seconds(
    device: torch.device,
    dtype: torch.dtype,
    size: int,
    *,
    min_seconds: float,
    max_seconds: float | None = None,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] = time.process_time,
) -> tuple[float, int]:
    """The fastest of at least MIN_REPEATS timed ``size``×``size`` matmuls after one warm-up, and how many were
    timed. On a CPU, where the warm-up shows that the repeats would take over ``max_seconds``, the warm-up
    (kernel selection included, so a slight underestimate of the rate) is the one sample: an estimate made from
    a smaller size can be far off where a dtype is emulated, its rate falling with the size. Not on a GPU, whose
    first matmul can include the math library's initialisation (seconds), which would pass for the rate.

    On a CPU each repeat counts the shorter of its wall time and its process CPU time over the threads: on a
    machine shared with other work the threads are descheduled part of the time, which stretches the wall
    time but not the CPU time, so the figure stays close to what the idle machine reaches."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    on_cpu = device.type == "cpu"
    threads = torch.get_num_threads()

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed() -> float:
        start, cpu_start = timer(), cpu_timer()
        torch.matmul(a, b)
        synchronize()
        wall = timer() - start
        busy = (cpu_timer() - cpu_start) / threads if on_cpu else wall
        return min(wall, busy if busy > 0 else wall)

    warm_up = timed()  # kernel selection, primitive caches
    if max_seconds is not None and on_cpu and MIN_REPEATS * warm_up > max_seconds:
        return warm_up, 1
    best, spent, repeats = float("inf"), 0.0, 0
    while repeats < MIN_REPEATS or spent < min_seconds:
        seconds = timed()
        best, spent, repeats = min(best, seconds), spent + seconds, repeats + 1
        if repeats >= 100:
            break
    return best, repeats


def measure_ceiling(
    device: torch.device,
    dtype: torch.dtype,
    *,
    sizes: tuple[int, ...] | None = None,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] = time.process_time,
) -> Ceiling:
    """Measure now: the best FLOP/s (2·n³ per n×n matmul) over the device type's sizes."""
    sizes = sorted(sizes or SIZES.get(device.type, SIZES["cpu"]))
    min_seconds = MIN_SECONDS_PER_SIZE.get(device.type, 0.25)
    load = load_average()  # before measuring: the measurement's own threads would count
    started = time.perf_counter()
    rates: dict[int, float] = {}
    skipped, one_sample = [], []

    def rate_at(size: int, min_seconds: float) -> float:
        seconds, repeats = matmul_seconds(
            device,
            dtype,
            size,
            min_seconds=min_seconds,
            max_seconds=MAX_MEASURE_SECONDS,
            timer=timer,
            cpu_timer=cpu_timer,
        )
        if seconds <= 0:
            raise RuntimeError(f"matmul of {size}² took {seconds} s: the timer is not advancing")
        if repeats == 1:
            one_sample.append(size)
        return 2 * size**3 / seconds

    pilot = rate_at(PILOT_SIZE, 0.0) if sizes[0] > PILOT_SIZE else None
    for size in sizes:
        known = max(rates.values()) if rates else pilot
        # this size's cost at the best rate so far: warm-up + MIN_REPEATS matmuls at least
        if known is not None:
            estimate = (MIN_REPEATS + 1) * 2 * size**3 / known
            if estimate > MAX_MEASURE_SECONDS:
                skipped.append(size)
                continue
        rates[size] = rate_at(size, min_seconds)
    if not rates:  # every size would pass the cap: the pilot is the measurement
        rates[PILOT_SIZE] = pilot
    best_size = max(rates, key=rates.get)
    return Ceiling(
        flops=rates[best_size],
        device=device_name(device),
        dtype=dtype_name(dtype),
        threads=torch.get_num_threads(),
        source="measured",
        provenance={
            "method": "best of repeated square matmuls (2·n³ FLOP each; CPU: min of wall and CPU time/threads)",
            "tflops_by_size": {str(size): round(rate / 1e12, 4) for size, rate in rates.items()},
            "best_size": best_size,
            "sizes_skipped": skipped,  # each would have taken over MAX_MEASURE_SECONDS
            "sizes_from_one_matmul": [size for size in one_sample if size in rates],  # its warm-up said so
            "seconds": round(time.perf_counter() - started, 3),
            "device_type": device.type,
            "load_average": load,
            "logical_cores": os.cpu_count(),
            "torch": torch.__version__,
            "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def cache_key(device: str, dtype: str, threads: int) -> str:
    return f"{device} | {dtype} | {threads} threads"


# The ceilings this process has used, by cache key: every MFU one run reports is against the same figure.
_IN_USE: dict[tuple[str, str], Ceiling] = {}


def peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    *,
    override: float | None = None,
    remeasure: bool = False,
    path: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Ceiling:
    """The ceiling for ``dtype`` on ``device`` with this process's threads: ``override`` when given, else the one
    this process already uses, else the best cached measurement, else measured now (a second or two) and cached.

    A cached record measured under load is measured again when the load now is lower than it was then; the cache
    keeps whichever figure is higher. ``remeasure`` measures again in any case (the best figure is still kept).
    ``progress`` is told before a measurement starts (the ``hardware`` command prints it)."""
    threads = torch.get_num_threads()
    name = device_name(device)
    if override:
        return Ceiling(override, name, dtype_name(dtype), threads, "override", {"given": override})
    path = path or cache_path()
    key = cache_key(name, dtype_name(dtype), threads)
    in_use = (str(path), key)
    if in_use in _IN_USE and not remeasure:
        return _IN_USE[in_use]
    records = read_cache(path)
    cached = Ceiling(**{**records[key], "source": "cache"}) if key in records else None
    if cached is not None and not remeasure and not worth_remeasuring(cached):
        _IN_USE[in_use] = cached
        return cached
    if progress is not None:
        why = (
            ""
            if cached is None
            else "measuring again as asked: "
            if remeasure
            else "measuring again (the cached figure was measured under load): "
        )
        progress(f"{why}measuring the {dtype_name(dtype)} matmul ceiling on {name}, {threads} threads ...")
    measured = measure_ceiling(device, dtype)
    if cached is None or measured.flops >= cached.flops:
        best = measured
    else:  # the earlier figure stays; the lower one is recorded beside it, as evidence of the load
        lower = {k: measured.provenance[k] for k in ("load_average", "measured_at")}
        best = replace(
            cached, provenance={**cached.provenance, "latest_lower": {"flops": measured.flops, **lower}}
        )
    records[key] = {**asdict(best), "source": "measured"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"version": CACHE_VERSION, "records": records})
    except OSError:
        pass  # a read-only home: the measurement still serves this process
    _IN_USE[in_use] = best
    return best


def worth_remeasuring(cached: Ceiling) -> bool:
    """A record measured under load, when the machine is less loaded now than it was then."""
    if not under_load(cached):
        return False
    now = load_average()
    return now is not None and now < cached.provenance["load_average"]


def forget_ceilings_in_use() -> None:
    """Let this process pick its ceilings afresh (tests; a long-lived caller that changed threads)."""
    _IN_USE.clear()


def read_cache(path: Path) -> dict[str, dict[str, Any]]:
    """The cached records; an unreadable or foreign file counts as empty (it is a cache)."""
    if not path.exists():
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    records = data.get("records")
    if not isinstance(records, dict):
        return {}
    fields = {"flops", "device", "dtype", "threads", "source", "provenance"}
    return {k: v for k, v in records.items() if isinstance(v, dict) and set(v) == fields}
