"""Test-only fault injection, outside the training loop: hooks the loop asks at each step whether they need the
step's losses read (``needs_read``) and then runs (``after_step``). None is installed unless a test asks for
one: in this process by appending to ``Trainer.step_hooks``, in a training subprocess (torchrun, the CLI) through
$TABLEFREE_FAULT_KILL_AFTER_STEP."""

from __future__ import annotations

import os
import signal
from typing import Protocol

# the exact-resume tests: the process SIGKILLs itself after this optimizer step
KILL_AFTER_STEP_ENV = "TABLEFREE_FAULT_KILL_AFTER_STEP"


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


def hooks_from_environment() -> list[StepHook]:
    """The hooks a test asked for through the environment (none in normal use)."""
    step = int(os.environ.get(KILL_AFTER_STEP_ENV, "0"))
    return [KillAfterStep(step)] if step else []
