"""Test-only fault injection, outside the training loop: hooks the loop asks at each step whether they need the
step's losses read (``needs_read``) and then runs (``after_step``). None is installed unless a test asks for
one: in this process by appending to ``Trainer.step_hooks``, in a training subprocess (torchrun, the CLI, a SLURM
job) through $TABLEFREE_FAULT_KILL_AFTER_STEP or $TABLEFREE_FAULT_HOLD_AFTER_STEP."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Protocol

# the exact-resume tests: the process SIGKILLs itself after this optimizer step
KILL_AFTER_STEP_ENV = "TABLEFREE_FAULT_KILL_AFTER_STEP"
# the preemption tests: the run waits after this optimizer step until a stop signal arrives, so a signal sent
# from outside (scancel) lands inside training however fast the steps are
HOLD_AFTER_STEP_ENV = "TABLEFREE_FAULT_HOLD_AFTER_STEP"
HOLD_LIMIT_S = 300.0  # past this the run trains on, and the test that set the hold fails on what it expected


class StepHook(Protocol):
    def needs_read(self, step: int) -> bool: ...

    def after_step(self, step: int) -> None: ...


class KillAfterStep:
    """SIGKILL this process right after optimizer step ``step``, its losses read first, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def needs_read(self, step: int) -> bool:
        return step == self.step

    def after_step(self, step: int) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class HoldAfterStep:
    """Wait right after optimizer step ``step`` (its losses read first, and logged where ``log_every`` divides it)
    until ``stop_requested()``, at most ``limit_s`` seconds; the loop then stops where it would have without the
    wait (one process: after the next step; several: at the next read point where they agree). A signal that
    lands between the step's log line and the wait stops the run after ``step`` itself."""

    def __init__(self, step: int, stop_requested: Callable[[], bool], limit_s: float = HOLD_LIMIT_S) -> None:
        self.step, self.stop_requested, self.limit_s = step, stop_requested, limit_s

    def needs_read(self, step: int) -> bool:
        return step == self.step

    def after_step(self, step: int) -> None:
        if step != self.step:
            return
        deadline = time.monotonic() + self.limit_s
        while not self.stop_requested() and time.monotonic() < deadline:
            time.sleep(0.05)


def hooks_from_environment(stop_requested: Callable[[], bool]) -> list[StepHook]:
    """The hooks a test asked for through the environment (none in normal use); ``stop_requested`` tells a hold
    that the run's stop signal has arrived."""
    hooks: list[StepHook] = []
    if kill := int(os.environ.get(KILL_AFTER_STEP_ENV, "0")):
        hooks.append(KillAfterStep(kill))
    if hold := int(os.environ.get(HOLD_AFTER_STEP_ENV, "0")):
        hooks.append(HoldAfterStep(hold, stop_requested))
    return hooks
