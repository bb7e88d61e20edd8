"""The sweep in this process, an executor of the same plan as ``tablefree.sweep.slurm``: every run in the plan's
order (a finished run is skipped, a trained one only evaluated, any other resumed or started), with an estimate
of the time left after each."""

from __future__ import annotations

import time
from typing import Any

from tablefree.sweep.config import CompareConfig
from tablefree.sweep.plan import RunPlan
from tablefree.sweep.run import execute_run
from tablefree.sweep.status import run_state


def run_local(config: CompareConfig, plans: list[RunPlan], log=print) -> dict[str, Any]:
    """Train and evaluate every run of ``plans`` here; returns ``{"out", "runs": {name: state}, "failed",
    "report": None}``."""
    outcome: dict[str, str] = {}
    took: list[float] = []  # seconds per run this invocation trained or evaluated, for the sweep's ETA
    for number, run in enumerate(plans, start=1):
        prefix = f"[run {number}/{len(plans)}] {run.name}"
        state = run_state(run, config.eval)
        if state == "done":
            log(f"{prefix}: finished earlier, skipped")
            outcome[run.name] = "done"
            continue
        started = time.perf_counter()
        outcome[run.name] = execute_run(config, run, state, prefix, log)
        took.append(time.perf_counter() - started)
        left = [p for p in plans[number:] if run_state(p, config.eval) != "done"]
        if left:
            log(f"sweep: {len(left)} run(s) to go, about {_duration(len(left) * sum(took) / len(took))} more")
    failed = [name for name, state in outcome.items() if state == "failed"]
    return {"out": str(config.out_dir), "runs": outcome, "failed": failed, "report": None}


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2.5 h``: an estimate's precision."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
