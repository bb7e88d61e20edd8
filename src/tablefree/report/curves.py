"""The fitted curves of a sweep with a budget grid: each finished run's final validation loss is one observation
(a separate run with its own schedule, or a decay branched from a shared stable phase), fitted per interface by
``tablefree.scaling``; the section says which schedule and which budgets produced the numbers, and how many
tokens branching saved.

Runs are grouped by what else their grid point sets (the learning rate, say): one fit per group. A group whose
design is too short for a fit (fewer than 5 budgets, a span under 16×, fewer than 3 seeds) gets the refusal and
its reason in place of the curves: a trend is never read off too few points.
"""

from __future__ import annotations

from typing import Any

from tablefree import scaling
from tablefree.config_parsing import load_yaml, parse_token_budgets
from tablefree.report import comparison
from tablefree.rundir import RUN_FILES, Run
from tablefree.sweep.branch_record import read_branch
from tablefree.sweep.grid import BUDGET, MODEL, recorded_points, same_except


def fitted_curves(
    runs: list[Run],
    config: dict[str, Any],
    interfaces: list[str],
    controls: list[str],
    n_boot: int,
    predict_at: list[str | int] | None = None,
    baseline: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One entry per group of grid points that differ only in their budget (and model size), with at least two
    budgets: the observations, the schedule, the branching and ``scaling.scaling_report``'s fits, which also
    predict the gaps at ``predict_at`` (token budgets; None: the sweep config's ``predict_at``). ``baseline``
    (``comparison.unigram_baseline``) sets where the fit window starts; without it the fits use every budget and
    say why."""
    budgets = (config.get("predict_at") or []) if predict_at is None else predict_at
    predict = [float(x) for x in parse_token_budgets(budgets, "predict_at")]
    groups: dict[str, list[str]] = {}
    for point in recorded_points(config):
        if point.budget is None:
            continue
        groups.setdefault(same_except(point.train, BUDGET, MODEL), []).append(point.name)
    entries = []
    for names in groups.values():
        here = [run for run in comparison.finished(runs) if run.point in names]
        observations = [o for o in (_observation(run) for run in here) if o is not None]
        if len({o.tokens for o in observations}) < 2:
            continue
        pairs = comparison.interface_pairs(
            [i for i in interfaces if any(o.interface == i for o in observations)], controls
        )
        spec = scaling.ScalingReportSpec(
            pairs=pairs,
            predict_at=predict,
            n_boot=min(n_boot, scaling.DEFAULT_BOOTSTRAP),
            unigram=baseline["val_loss"] if baseline else None,
            unigram_unavailable=None if baseline else comparison.baseline_unavailable(here),
        )
        fits = scaling.scaling_report(observations, spec)
        entries.append(
            {
                "points": names,
                "observations": [o.__dict__ for o in observations],
                "schedule": _schedule(here),
                "branching": _branching(here),
                "fits": fits,
            }
        )
    return entries


def observations_of(entry: dict[str, Any]) -> list[scaling.Observation]:
    return scaling.observations_from_dicts(entry["observations"])


def _observation(run: Run) -> scaling.Observation | None:
    loss = run.metric_values().get(comparison.VAL_LOSS)
    summary = run.summary or {}
    if loss is None or not summary.get("tokens_seen"):
        return None
    # the model's size is its body's, the same for every interface (the learned model's count, table included):
    # the other interfaces' own trainable counts are smaller, and would split one body into several "sizes"
    params = (summary.get("params") or {}).get("learned_total")
    return scaling.Observation(run.interface, run.seed, float(summary["tokens_seen"]), loss, params)


def _schedule(runs: list[Run]) -> dict[str, Any] | None:
    """The schedule the group's runs share (the budget aside), as recorded in their config.yaml."""
    for run in runs:
        recipe = load_yaml(run.directory / RUN_FILES["config"])
        schedule = recipe.get("schedule") or {}
        return {
            **schedule,
            "peak_lr": (recipe.get("optim") or {}).get("lr"),
            "batch_tokens": recipe.get("batch_tokens"),
        }
    return None


def _branching(runs: list[Run]) -> dict[str, Any]:
    """Per budget: how many of its runs were branched, and from which step they trained their own decay; the
    tokens trained against the tokens the same runs would take from scratch."""
    per_point: dict[str, dict[str, Any]] = {}
    decay_steps: dict[str, set[int]] = {}
    trained = from_scratch = 0.0
    for run in runs:
        summary = run.summary or {}
        tokens = float(summary.get("tokens_seen") or 0)
        branch = read_branch(run.directory)
        batch_tokens = load_yaml(run.directory / RUN_FILES["config"])["batch_tokens"]
        from_scratch += tokens
        trained += tokens - (branch["step"] * batch_tokens if branch else 0)
        row = per_point.setdefault(
            run.point,
            {
                "tokens": tokens,
                "steps": summary.get("total_steps"),
                "runs": 0,
                "branched": 0,
                "branched_from": None,
                "decay_from_step": None,
            },
        )
        # a budget's runs may be trained either way (one added after some trunks had finished trains from
        # scratch for those): count both, never label the budget from its first run
        row["runs"] += 1
        if branch:
            row["branched"] += 1
            row["branched_from"] = branch["trunk"].split("/")[0]
            decay_steps.setdefault(run.point, set()).add(branch["step"])
    for point, steps in decay_steps.items():  # one step unless the budget's runs branched at different steps
        ordered = sorted(steps)
        per_point[point]["decay_steps"] = ordered
        per_point[point]["decay_from_step"] = (
            ordered[0] if len(ordered) == 1 else ", ".join(map(str, ordered))
        )
    return {
        "points": dict(sorted(per_point.items(), key=lambda item: item[1]["tokens"])),  # by budget
        "tokens_trained": trained,
        "tokens_from_scratch": from_scratch,
        "saving": 1 - trained / from_scratch if from_scratch else 0.0,
    }
