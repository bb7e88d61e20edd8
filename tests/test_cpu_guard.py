"""The CPU-time guard (tests/cpu_guard.py) run on a small suite of its own: a test not marked slow fails past
the limit, by CPU time (its own and its children's), not wall time; a slow test and a shared fixture's setup do
not count against it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LIMIT = 0.1  # CPU seconds; the busy tests below spend 2.5 times that

SUITE = """
import subprocess
import sys
import time

import pytest

BUSY = 2.5 * LIMIT


def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


@pytest.fixture(scope="module")
def expensive_shared():
    burn(BUSY)


def test_busy_unmarked():
    burn(BUSY)


@pytest.mark.slow
def test_busy_marked_slow():
    burn(BUSY)


def test_busy_in_a_child_process():
    code = "import time\\nstart = time.process_time()\\nwhile time.process_time() - start < %r: pass" % BUSY
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sleeping_costs_no_cpu():
    time.sleep(BUSY)


def test_cheap_with_an_expensive_shared_fixture(expensive_shared):
    pass


def test_busy_but_failing_anyway():
    burn(BUSY)
    assert False, "its own failure"
""".replace("LIMIT", repr(LIMIT))


@pytest.fixture
def guarded(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\nmarkers =\n    slow: an end-to-end test\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_the_guard_fails_unmarked_tests_over_the_limit_by_cpu_time(guarded: pytest.Pytester) -> None:
    result = guarded.runpytest_inprocess("-p", "cpu_guard", f"--cpu-limit={LIMIT}", "--cpu-times", "-rA")
    outcomes = {
        line.split()[1].split("::")[1]: line.split()[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED "))
    }
    assert outcomes == {
        "test_busy_unmarked": "FAILED",
        "test_busy_marked_slow": "PASSED",
        "test_busy_in_a_child_process": "FAILED",  # a finished child's CPU counts
        "test_sleeping_costs_no_cpu": "PASSED",  # wall time does not
        "test_cheap_with_an_expensive_shared_fixture": "PASSED",  # the module fixture's setup is no test's
        "test_busy_but_failing_anyway": "FAILED",
    }
    result.assert_outcomes(passed=3, failed=3)
    # the guard's own message, once per test it failed; a test failing on its own keeps its own message
    assert sum(line.startswith("cpu guard: this test spent") for line in result.outlines) == 2
    assert "its own failure" in result.stdout.str()
    result.stdout.fnmatch_lines(["*over the 0.1 s allowed a test not marked slow*"])
    # --cpu-times lists the tests and the shared setup apart
    result.stdout.fnmatch_lines(["*test_suite.py::test_busy_marked_slow  slow", "*module expensive_shared"])


def test_the_guard_is_off_at_limit_zero_and_refuses_a_negative_limit(guarded: pytest.Pytester) -> None:
    guarded.runpytest_inprocess("-p", "cpu_guard", f"--cpu-limit={LIMIT}", "-k", "unmarked").assert_outcomes(
        failed=1, deselected=5
    )
    guarded.runpytest_inprocess("-p", "cpu_guard", "--cpu-limit=0", "-k", "unmarked").assert_outcomes(
        passed=1, deselected=5
    )
    refused = guarded.runpytest_inprocess("-p", "cpu_guard", "--cpu-limit=-1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--cpu-limit: expected seconds >= 0*got -1.0*"])


def test_the_guard_and_its_list_work_when_xdist_workers_run_the_tests(
    guarded: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test` runs the suite on xdist workers: the verdicts are the workers', the list the controller's."""
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # where the workers import cpu_guard from
    result = guarded.runpytest_subprocess(
        "-p", "cpu_guard", f"--cpu-limit={LIMIT}", "--cpu-times", "-n", "2", "-p", "xdist"
    )
    result.assert_outcomes(passed=3, failed=3)
    assert sum(line.startswith("cpu guard: this test spent") for line in result.outlines) == 2
    result.stdout.fnmatch_lines(["*test_suite.py::test_busy_marked_slow  slow", "*module expensive_shared"])
