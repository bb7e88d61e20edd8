"""The sweep in this process, an executor of the same plan as ``tablefree.sweep.slurm``: every run in the plan's
order (a finished run is skipped, a trained one only evaluated, any other resumed or started), with an estimate
of the time left after each."""

from __future__ import annotations

import time
from typing import Any

from tablefree.sweep.config import CompareConfig
from tablefree.sweep.grid import same_except
from tablefree.sweep.plan import RunPlan
from tablefree.sweep.run import execute_run
from tablefree.sweep.status import check_branch, hold_sweep, run_state
from tablefree.train.recipe import budget_steps


def run_local(config: CompareConfig, plans: list[RunPlan], log=print) -> dict[str, Any]:
    """Train and evaluate every run of ``plans`` here, holding the sweep's lock (``hold_sweep``: a second
    ``compare`` is refused, ``--status`` names this process); returns ``{"out", "runs": {name: state},
    "failed", "report": None}``."""
    with hold_sweep(config.out_dir):
        return _run_plans(config, plans, log)


def _run_plans(config: CompareConfig, plans: list[RunPlan], log) -> dict[str, Any]:
    outcome: dict[str, str] = {}
    # per model size: [tokens, seconds] of the runs this invocation trained and evaluated, for the time left
    measured: dict[str, list[float]] = {}
    for number, run in enumerate(plans, start=1):
        prefix = f"[run {number}/{len(plans)}] {run.name}"
        check_branch(run)  # against its trunk as it is now: one retrained by this sweep is checked here
        state = run_state(run, config.eval)
        if state == "done":
            log(f"{prefix}: finished earlier, skipped")
            outcome[run.name] = "done"
            continue
        started = time.perf_counter()
        outcome[run.name] = execute_run(config, run, state, prefix, log)
        if state == "todo" and outcome[run.name] == "done":
            rate = measured.setdefault(_model_key(run), [0.0, 0.0])
            rate[0] += tokens_to_train(run)
            rate[1] += time.perf_counter() - started
        left = [p for p in plans[number:] if run_state(p, config.eval) != "done"]
        if left:
            log(f"sweep: {len(left)} run(s) to go; {time_left(left, measured)}")
    failed = [name for name, state in outcome.items() if state == "failed"]
    return {"out": str(config.out_dir), "runs": outcome, "failed": failed, "report": None}


def tokens_to_train(run: RunPlan) -> int:
    """The tokens a run trains from its start (a branch: from its branch step)."""
    config = run.train_config
    start = run.branch.step if run.branch is not None else 0
    return (budget_steps(config.budget, config.batch_tokens) - start) * config.batch_tokens


def time_left(left: list[RunPlan], measured: dict[str, list[float]]) -> str:
    """The time the runs ``left`` take at the token rate (training and evaluation together) of the runs of the
    same model size finished here; unknown while a size has none. Runs of other budgets take time in
    proportion to their tokens, not one average run's time each."""
    unmeasured = sorted({_model_key(run) for run in left} - measured.keys())
    if unmeasured:
        return "time left unknown until a run of each model size has finished here"
    seconds = sum(
        tokens_to_train(run) * measured[_model_key(run)][1] / measured[_model_key(run)][0] for run in left
    )
    return f"about {_duration(seconds)} more at the token rate of the runs finished so far"


def _model_key(run: RunPlan) -> str:
    return same_except(run.recipe.get("model") or {}, "interface")


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2.5 h``: an estimate's precision."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
