"""How a CPU run waits for its threads, chosen when the command line starts, so a run on a shared machine slows
in proportion to the load instead of collapsing.

torch's CPU kernels run on OpenMP threads. By default an OpenMP thread that reaches the end of a parallel region
spins for a while before it sleeps; when another process holds one of the cores, the threads that have a core
spin waiting for the one that has none, and a training step slows several times over (docs/benchmarks.md,
"CPU threads on a shared machine"). ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep instead. OpenMP reads the
variable once, when its runtime loads with ``import torch``, so ``tablefree``'s entry point sets it before any
verb imports torch (``choose_wait_policy``); torchrun workers and sweep subprocesses inherit it. An
``OMP_WAIT_POLICY`` that is already set (yours) is kept. The thread count is left to torch (one per physical
core) or to ``OMP_NUM_THREADS``. A Python caller that imported torch already keeps OpenMP's default; the run's
header says which case it is (``describe``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
CHOSEN_POLICY = "PASSIVE"
# Set beside OMP_WAIT_POLICY when tablefree chose it, so a child process (which inherits both) can say so.
CHOSEN_BY_ENV = "TABLEFREE_CHOSE_OMP_WAIT_POLICY"

# Whether this process set the policy only after torch (and so OpenMP) had loaded: then it reaches children only.
_set_after_torch_loaded = False


def choose_wait_policy(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already; the policy now in effect for new processes."""
    global _set_after_torch_loaded
    own = environ is None
    environ = os.environ if environ is None else environ
    if WAIT_POLICY_ENV in environ:
        return environ[WAIT_POLICY_ENV]
    environ[WAIT_POLICY_ENV] = CHOSEN_POLICY
    environ[CHOSEN_BY_ENV] = CHOSEN_POLICY
    if own:
        _set_after_torch_loaded = "torch" in sys.modules
    return CHOSEN_POLICY


def threading_choice() -> dict[str, object]:
    """What this process runs with: torch's threads and the OpenMP wait policy, and where each came from."""
    # torch only here: this module must be importable before torch, to set the wait policy OpenMP reads on load
    import torch

    policy = os.environ.get(WAIT_POLICY_ENV)
    chosen = policy is not None and os.environ.get(CHOSEN_BY_ENV) == policy
    if policy is None:
        origin = "OpenMP's default, spinning waits: OMP_WAIT_POLICY is unset (PASSIVE suits a shared machine)"
        effective = None
    elif chosen and _set_after_torch_loaded:
        origin = "OpenMP's default, spinning waits: torch was loaded before OMP_WAIT_POLICY could be set"
        effective = None
    elif chosen:
        origin = "set by tablefree: spinning waits collapse a run when other work shares the cores"
        effective = policy
    else:
        origin = "yours (the environment's OMP_WAIT_POLICY)"
        effective = policy
    num_threads = os.environ.get("OMP_NUM_THREADS")
    return {
        "threads": torch.get_num_threads(),
        "threads_from": f"OMP_NUM_THREADS={num_threads}"
        if num_threads
        else "torch's default (physical cores)",
        "wait_policy": effective,
        "wait_policy_from": origin,
    }


def describe() -> str:
    """One line for a run's header, e.g. ``2 (torch's default ...); OMP_WAIT_POLICY=PASSIVE, set by tablefree ...``."""
    choice = threading_choice()
    policy = f"OMP_WAIT_POLICY={choice['wait_policy']}, " if choice["wait_policy"] else ""
    return f"{choice['threads']} ({choice['threads_from']}); {policy}{choice['wait_policy_from']}"
