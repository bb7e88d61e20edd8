"""A pytest plugin that keeps the edit-test loop fast: it measures each test's CPU time and fails a test not
marked ``slow`` whose CPU time is over the limit (``--cpu-limit``); ``--cpu-times`` lists the measurements.

What is measured: the CPU seconds (user + system) of the pytest process, all its threads, plus those of its
child processes once they have been waited for (``RUSAGE_CHILDREN``: ``subprocess.run`` and a closed
multiprocessing pool are counted; a child still running when the test ends is not), from the start of the
test's setup to the end of its call. Setting up a fixture shared by several tests (class, module, package or
session scope) is left out of every test's figure: whichever test happens to come first would otherwise pay
for it, so the verdict would depend on which tests were selected. ``--cpu-times`` lists those setups apart.

CPU time, not wall time, because it hardly changes when other work shares the machine: the suite runs on
busy 2-core machines where a test's wall time can triple. It does grow with a slower CPU and with threads
that spin, which is why the limit sits well above the marking rule (see ``DEFAULT_LIMIT_SECONDS``).
"""

from __future__ import annotations

import resource

import pytest

# The marking rule: a test over this many CPU seconds on the development machine is an end-to-end test and
# gets @pytest.mark.slow (`make test-fast`, -m "not slow", leaves those out).
SLOW_CPU_SECONDS = 3.0
# The guard's limit for tests not marked slow. Well above the marking rule so that a test marked correctly on
# a fast CPU does not fail on a slow one: the 2-core AVX2 machine of issue 45 multiplies fp32 at 36 GFLOP/s per
# core against the development machine's 88 (docs/benchmarks.md, "The test suite's time"), so a test at 3 s
# here may take 7 s there, and a loaded core's CPU time drifts up by some tens of percent (caches shared with
# other work). A test past 10 s is mis-marked on every machine.
DEFAULT_LIMIT_SECONDS = 10.0
# Below this (or half the limit, if lower) a test is left out of the --cpu-times list (it only makes the list
# long).
LISTED_SECONDS = 0.5

_spent_key = pytest.StashKey[dict]()
_fixtures_key = pytest.StashKey[list]()
_state_key = pytest.StashKey[dict]()
_summary_fixtures_key = pytest.StashKey[list]()
CPU_SECONDS = "cpu_guard_seconds"  # report.user_properties: (CPU seconds, marked slow)
SHARED_SETUPS = "cpu_guard_shared_setups"  # report.user_properties: the shared fixtures set up in this test


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its children that have been waited for."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu guard")
    group.addoption(
        "--cpu-limit",
        type=float,
        default=DEFAULT_LIMIT_SECONDS,
        metavar="SECONDS",
        help=f"fail a test not marked slow that spends more CPU seconds than this in setup and call "
        f"(default {DEFAULT_LIMIT_SECONDS:g}; 0 turns the guard off, e.g. under a debugger or coverage)",
    )
    group.addoption(
        "--cpu-times",
        action="store_true",
        help=f"list each test's CPU seconds; flag unmarked tests over the marking rule, {SLOW_CPU_SECONDS:g} s",
    )


def pytest_configure(config: pytest.Config) -> None:
    limit = config.getoption("--cpu-limit")
    if limit < 0:
        raise pytest.UsageError(f"--cpu-limit: expected seconds >= 0 (0 turns the guard off), got {limit}")
    config.stash[_spent_key] = {}
    config.stash[_fixtures_key] = []
    config.stash[_summary_fixtures_key] = []
    config.pluginmanager.register(_Collector(config), "cpu_guard_collector")
    # start: CPU seconds when the running test's setup began; shared: CPU seconds its shared fixtures took;
    # depth: nesting of shared fixture setups (one shared fixture may set up another)
    config.stash[_state_key] = {"start": None, "shared": 0.0, "depth": 0}


def _is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    state = item.config.stash[_state_key]
    state.update(start=cpu_seconds(), shared=0.0, depth=0)
    yield
    state["start"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    state = request.config.stash[_state_key]
    if fixturedef.scope == "function" or state["start"] is None:
        yield
        return
    state["depth"] += 1
    started = cpu_seconds()
    try:
        yield
    finally:
        state["depth"] -= 1
        if state["depth"] == 0:  # an inner shared fixture is inside its outer one's figure already
            seconds = cpu_seconds() - started
            state["shared"] += seconds
            request.config.stash[_fixtures_key].append((f"{fixturedef.scope} {fixturedef.argname}", seconds))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash[_state_key]
    if report.when != "call" or state["start"] is None:
        return
    seconds = cpu_seconds() - state["start"] - state["shared"]
    # on the report, so that the process writing the summary has it also when xdist's workers ran the tests
    report.user_properties.append((CPU_SECONDS, (seconds, _is_slow(item))))
    fixtures = item.config.stash[_fixtures_key]
    report.user_properties.append((SHARED_SETUPS, list(fixtures)))
    fixtures.clear()
    limit = item.config.getoption("--cpu-limit")
    if limit and report.passed and not _is_slow(item) and seconds > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"cpu guard: this test spent {seconds:.1f} CPU seconds in setup and call (this process and its "
            f"finished children), over the {limit:g} s allowed a test not marked slow. Make it cheaper, or "
            f"mark it @pytest.mark.slow if it is an end-to-end test (the rule: over {SLOW_CPU_SECONDS:g} CPU "
            f"seconds on the development machine; tests/cpu_guard.py)."
        )


class _Collector:
    """Gathers the figures from the tests' reports in the process that writes the summary (pytest's own, or
    xdist's controller when workers ran the tests)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        if CPU_SECONDS in properties:
            self.config.stash[_spent_key][report.nodeid] = tuple(properties[CPU_SECONDS])
            self.config.stash[_summary_fixtures_key].extend(map(tuple, properties[SHARED_SETUPS]))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    spent = config.stash.get(_spent_key, {})
    if not config.getoption("--cpu-times") or not spent:
        return
    write = terminalreporter.write_line
    listed = min(LISTED_SECONDS, config.getoption("--cpu-limit") / 2 or LISTED_SECONDS)
    terminalreporter.section("CPU seconds per test, setup and call (slowest first)")
    for nodeid, (seconds, slow) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        if seconds < listed:
            break
        flag = "slow" if slow else ("UNMARKED, over the marking rule" if seconds > SLOW_CPU_SECONDS else "")
        write(f"{seconds:8.2f}  {nodeid}  {flag}")
    for label, want in (("slow", True), ("not slow", False)):
        total = sum(s for s, slow in spent.values() if slow == want)
        write(f"total CPU seconds of the {label} tests: {total:.1f}")
    shared = [(name, s) for name, s in config.stash[_summary_fixtures_key] if s >= listed]
    if shared:
        write("shared fixtures' setup (in no test's figure above):")
        for name, seconds in sorted(shared, key=lambda pair: -pair[1]):
            write(f"{seconds:8.2f}  {name}")
