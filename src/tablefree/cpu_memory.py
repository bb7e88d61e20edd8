"""Keep freed memory for reuse on the CPU: no fresh pages for every large tensor of every step.

glibc's malloc serves a block above its mmap threshold (128 KB, rising to at most 32 MB as large blocks are freed)
with a fresh ``mmap`` and hands it back to the kernel on ``free``. A CPU training step allocates and frees tensors
larger than that every step (the logits of ``tiny`` at micro-batch 8 × 512 are 64 MB, and their gradient as
much), so every step pays a page fault for every 4 KB page of them. Raising the mmap and trim thresholds to 1 GB
(``mallopt``) makes malloc serve those blocks from its heap and keep them there when freed, so the next step
reuses the same pages. Measured on the demo's recipe on 2 cores (docs/benchmarks.md): system time 4.1 → 0.7 s
and 17% more tokens/s, with identical losses; peak RSS 0.9 → 0.96-1.16 GB (on `small`: 2% faster, same RSS).

It applies to the whole process, from the first CPU run (or ``run_eval``) on, and for good: a library caller's
process keeps it, and freed memory below 1 GB stays with the process rather than going back to the system.
Linux with glibc >= 2.35 only; ``TABLEFREE_MALLOC=system`` leaves malloc as it is (for comparisons).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

import torch

from tablefree.precision import Decision

ENV = "TABLEFREE_MALLOC"
THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory(device: torch.device) -> Decision:
    """Raise glibc's malloc thresholds for a CPU run (once per process); the decision says what was done."""
    if device.type != "cpu":
        return Decision(False, f"not needed on {device.type}")
    if os.environ.get(ENV, "").strip().lower() == "system":
        return Decision(False, f"{ENV}=system: malloc's defaults")
    return _apply()


@functools.cache
def _apply() -> Decision:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return Decision(
            False, "malloc's defaults (the thresholds are glibc's, and this is not Linux with glibc)"
        )
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES):  # glibc < 2.35 caps it at 32 MB
        return Decision(False, "malloc's defaults (this glibc refuses an mmap threshold of 1 GB)")
    libc.mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES)
    return Decision(True, "freed blocks up to 1 GB stay in malloc's heap for reuse (no page faults per step)")
