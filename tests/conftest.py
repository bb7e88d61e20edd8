from __future__ import annotations

import atexit
import os
import shutil
import tempfile
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

# The matmul ceilings the tests' trainings measure go to this test process's own cache, not the user's
# (~/.cache/tablefree/peak_flops.json): a worker measures beside the other worker's load, a study running on the
# machine reads the user's cache, and CI's clean machine has none either.
_CEILINGS = tempfile.mkdtemp(prefix="tablefree-tests-")
atexit.register(shutil.rmtree, _CEILINGS, ignore_errors=True)
os.environ.setdefault("TABLEFREE_PEAK_FLOPS_CACHE", str(Path(_CEILINGS) / "peak_flops.json"))

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
