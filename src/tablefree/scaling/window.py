"""The fit window: the budgets a fit uses, starting past the unigram plateau.

A model that has not beaten the unigram baseline (the cross-entropy, on the validation tokens, of token
frequencies counted on the training split) has learned no more than token frequencies; its loss is set by how
fast it leaves that plateau, which no power law in D describes. So a fit starts at the smallest budget from
which on every run of every interface beats the baseline by ``PLATEAU_MARGIN`` nats/token or more, at that
budget and at every larger one. The margin is about 5% in perplexity: several seed standard deviations of the
runs near the plateau (0.003–0.03 nats/token in the shipped studies), so a run that merely touches the baseline
is still counted as on it. Without a baseline (the prepared dataset could not be read) the window is every
budget, and the window says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from tablefree.scaling.observations import Observation
from tablefree.units import human

PLATEAU_MARGIN = 0.05  # nats/token below the unigram baseline that every run of a fitted budget must reach


def rule(margin: float = PLATEAU_MARGIN) -> str:
    return (
        f"from the smallest budget at which, and above which, every run of every interface beats the unigram "
        f"baseline by {margin:g} nats/token or more"
    )


def fit_window(
    observations: Sequence[Observation],
    unigram: float | None,
    margin: float = PLATEAU_MARGIN,
    unavailable: str | None = None,
) -> dict:
    """The budgets a fit uses (module docstring), with each budget's worst run against the baseline.
    ``unigram`` the baseline in nats/token, or None with ``unavailable`` saying why there is none."""
    budgets = sorted({o.tokens for o in observations})
    window = {"rule": rule(margin), "margin": margin, "unigram_baseline": unigram}
    if unigram is None:
        why = unavailable or "no unigram baseline was given"
        return {
            **window,
            "budgets": budgets,
            "start": budgets[0] if budgets else None,
            "fallback": f"{why}: the fits use every budget, the plateau unchecked",
            "per_budget": [],
        }
    per_budget = []
    for budget in budgets:
        runs = [o for o in observations if o.tokens == budget]
        worst = max(runs, key=lambda o: o.loss)
        on_plateau = sorted(f"{o.interface}-s{o.seed}" for o in runs if o.loss > unigram - margin)
        per_budget.append(
            {
                "tokens": budget,
                "runs": len(runs),
                "worst_loss": worst.loss,
                "worst_run": f"{worst.interface}-s{worst.seed}",
                "below_baseline_by": unigram - worst.loss,
                "on_plateau": on_plateau,
            }
        )
    start = None
    for row in reversed(per_budget):
        if row["on_plateau"]:
            break
        start = row["tokens"]
    inside = [b for b in budgets if start is not None and b >= start]
    return {
        **window,
        "budgets": inside,
        "start": start,
        "fallback": None,
        "per_budget": per_budget,
    }


def window_sentence(window: dict) -> str:
    if window["fallback"]:
        return f"Fit window: every budget ({window['fallback']})."
    if not window["budgets"]:
        return (
            f"Fit window: none. At the largest budget some run is still within {window['margin']:g} nats/token of "
            f"the unigram baseline ({window['unigram_baseline']:.4f}): no budget is past the plateau, so nothing is fitted."
        )
    left = [row for row in window["per_budget"] if row["tokens"] < window["start"]]
    dropped = "; ".join(
        f"{human(row['tokens'])} ({len(row['on_plateau'])} of {row['runs']} runs within the margin or above it)"
        for row in left
        if row["on_plateau"]
    )
    return (
        f"Fit window: {', '.join(human(b) for b in window['budgets'])} tokens, {window['rule']} "
        f"({window['unigram_baseline']:.4f} nats/token)" + (f"; left out: {dropped}." if dropped else ".")
    )
