from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# `pytest --cpu-times` reports each test's CPU seconds (this process and its children, setup to teardown).
# Unlike wall time, CPU time hardly changes when the machine is busy, so it decides the `slow` marker on a
# shared machine: a test over SLOW_CPU_SECONDS of CPU is an end-to-end test and gets @pytest.mark.slow.
SLOW_CPU_SECONDS = 3.0
_cpu_times: dict[str, tuple[float, bool]] = {}


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-times",
        action="store_true",
        help=f"report each test's CPU seconds; flag unmarked tests over {SLOW_CPU_SECONDS} s (see conftest.py)",
    )


def _cpu_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if not item.config.getoption("--cpu-times"):
        yield
        return
    start = _cpu_seconds()
    yield
    _cpu_times[item.nodeid] = (_cpu_seconds() - start, item.get_closest_marker("slow") is not None)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if not _cpu_times:
        return
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds per test (slowest first)")
    for nodeid, (seconds, slow) in sorted(_cpu_times.items(), key=lambda kv: -kv[1][0]):
        if seconds < 0.5:
            break
        flag = "slow" if slow else ("UNMARKED, over the slow limit" if seconds > SLOW_CPU_SECONDS else "")
        write(f"{seconds:8.2f}  {nodeid}  {flag}")
    for label, want in (("slow", True), ("not slow", False)):
        total = sum(s for s, slow in _cpu_times.values() if slow == want)
        write(f"total CPU seconds of the {label} tests: {total:.1f}")
