from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one xdist worker per core: each computes on one thread, and so do the processes its tests
    # start (they inherit the environment), so the workers do not oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# The CPU-time guard and `pytest --cpu-times` (tests/cpu_guard.py): a test not marked slow fails past
# `--cpu-limit` CPU seconds.
pytest_plugins = ["cpu_guard"]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
