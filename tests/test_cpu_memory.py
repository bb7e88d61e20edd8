"""The CPU allocator setting: large tensors come from malloc's heap, which keeps them for reuse, instead of a
fresh mapping that is handed back to the kernel when the tensor is freed."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import subprocess
import sys

import pytest
import torch

from tablefree.cpu_memory import ENV, keep_freed_memory

# Allocate and free a 64 MB tensor (the size of `tiny`'s logits at micro-batch 8 x 512) 7 times, and report how
# many MB of each came from a mapping of its own (mallinfo2's hblkhd).
CYCLES = """
import ctypes, ctypes.util, torch
from tablefree.cpu_memory import keep_freed_memory
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
decision = keep_freed_memory(torch.device("cpu"))
mapped = []
for _ in range(7):
    before = libc.mallinfo2().hblkhd
    tensor = torch.ones(16 << 20)
    mapped.append((libc.mallinfo2().hblkhd - before) >> 20)
    del tensor
print(decision.value, *mapped)
"""


def mapped_mb(env_value: str | None) -> tuple[str, list[int]]:
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path)}
    if env_value is not None:
        env[ENV] = env_value
    out = subprocess.run([sys.executable, "-c", CYCLES], env=env, capture_output=True, text=True, check=True)
    applied, *mapped = out.stdout.split()
    return applied, [int(mb) for mb in mapped]


def has_mallinfo2() -> bool:
    return platform.libc_ver()[0] == "glibc" and hasattr(
        ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2"
    )


@pytest.mark.skipif(not has_mallinfo2(), reason="the thresholds and mallinfo2 are glibc's (>= 2.33)")
def test_large_tensors_come_from_the_heap_not_from_fresh_mappings() -> None:
    applied, mapped = mapped_mb(None)
    if applied == "False":  # glibc before 2.35 caps the mmap threshold at 32 MB and refuses 1 GB
        pytest.skip("this glibc refuses the thresholds (the run then says so and keeps malloc's defaults)")
    assert mapped == [0] * 7
    assert mapped_mb("system") == (
        "False",
        [64] * 7,
    )  # malloc's default: a mapping per tensor, unmapped on free


def test_only_cpu_runs_change_the_allocator() -> None:
    decision = keep_freed_memory(torch.device("meta"))
    assert decision.value is False and "not needed on meta" in decision.reason
