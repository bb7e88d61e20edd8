"""Everything of one set of observations as strict JSON: per model size the measured changes and the fit against
tokens, per tokens-per-parameter ratio the fit against parameters, refusals with their reasons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tablefree import stats
from tablefree.fileio import strict_json
from tablefree.scaling.analysis import DEFAULT_HORIZON, analyse, form_checks
from tablefree.scaling.backtests import PER_SEED_BELOW
from tablefree.scaling.fits import HUBER_DELTA
from tablefree.scaling.intervals import DEFAULT_BOOTSTRAP
from tablefree.scaling.measured import measured_changes
from tablefree.scaling.observations import Observation, groups_by_tokens_per_param
from tablefree.scaling.token_ratio import token_ratio
from tablefree.scaling.window import PLATEAU_MARGIN, fit_window, window_sentence
from tablefree.units import human


@dataclass(frozen=True)
class ScalingReportSpec:
    """How to fit and report a set of observations. ``pairs``: the (a, b) interface pairs whose gap is followed
    (None: every pair); ``predict_at``: token budgets to predict the gaps at (the largest budget run always is
    one); ``horizon`` / ``params_horizon``: how far the parity search looks, in tokens and in parameters;
    ``n_boot`` seed resamples with RNG ``seed``, ``confidence`` of the intervals; ``unigram``: the unigram
    baseline in nats/token that places the fit window past the plateau (``unigram_unavailable`` says why it is
    missing), ``plateau_margin``: how far past it. The report records these as its ``arguments``, and
    ``scaling_report(observations, ScalingReportSpec(**report["arguments"]))`` recomputes it bit for bit."""

    pairs: Sequence[tuple[str, str]] | None = None
    predict_at: Sequence[float] = ()
    horizon: float = DEFAULT_HORIZON
    params_horizon: float = DEFAULT_HORIZON
    n_boot: int = DEFAULT_BOOTSTRAP
    seed: int = stats.DEFAULT_SEED
    confidence: float = 0.95
    unigram: float | None = None
    unigram_unavailable: str | None = None
    plateau_margin: float = PLATEAU_MARGIN

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence: expected a level between 0 and 1, got {self.confidence!r}")
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or self.n_boot < 1:
            raise ValueError(f"n_boot: expected a positive number of resamples, got {self.n_boot!r}")
        for name in ("horizon", "params_horizon"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive size, got {getattr(self, name)!r}")


def scaling_report(observations: Sequence[Observation], spec: ScalingReportSpec | None = None) -> dict:
    """Everything, as strict-JSON-ready data: per model size the fit against tokens (``analyse``), and where
    the runs have several sizes, per tokens-per-parameter ratio the fit against parameters; a design too short
    for a fit is recorded with the reason (``refused``) instead. ``predict_at`` are token budgets to predict
    the gaps at (the largest budget run always is one). Per model size, ``measured`` holds how each pair's
    measured gap moved between consecutive budgets (``measured_changes``: no fit, also where the fit is
    refused). ``sentences`` collects those, then every fit's sentences and refusals.

    Per model size also: ``fit_window``, the budgets the fits against tokens use (``window.fit_window``: past
    the unigram plateau, given ``unigram``, the baseline in nats/token; without it every budget, with
    ``unigram_unavailable`` saying why); ``token_ratio`` (``token_ratio.token_ratio``, no fit, every budget);
    and ``forms``, the second functional form and the expanding-window backtests of both forms
    (``analysis.form_checks``) on the fit window."""
    spec = spec or ScalingReportSpec()
    pairs, predict_at, horizon, params_horizon, n_boot = (
        spec.pairs,
        spec.predict_at,
        spec.horizon,
        spec.params_horizon,
        spec.n_boot,
    )
    seed, confidence, plateau_margin = spec.seed, spec.confidence, spec.plateau_margin
    unigram, unigram_unavailable = spec.unigram, spec.unigram_unavailable
    kwargs = {"pairs": pairs, "n_boot": n_boot, "seed": seed, "confidence": confidence}
    sizes = sorted({o.params for o in observations}, key=lambda p: (p is not None, p or 0.0))
    by_tokens = []
    sentences = []
    for size in sizes:
        group = [o for o in observations if o.params == size]
        label = f"{human(size)} parameters: " if len(sizes) > 1 and size is not None else ""
        present = {o.interface for o in group}
        here = None if pairs is None else [p for p in pairs if set(p) <= present]
        measured = measured_changes(group, pairs=here, confidence=confidence)
        measured["sentences"] = [label + s for s in measured["sentences"]]
        sentences.extend(measured["sentences"])
        window = fit_window(group, unigram, plateau_margin, unigram_unavailable)
        sentences.append(label + window_sentence(window))
        inside = [o for o in group if o.tokens in set(window["budgets"])]
        entry = _try(
            label,
            sentences,
            lambda inside=inside, window=window: analyse(
                _window_or_refuse(inside, window),
                x_name="tokens",
                predict_at=predict_at,
                horizon=horizon,
                **kwargs,
            ),
            "fit against tokens",
        )
        forms = _try(
            label,
            sentences,
            lambda inside=inside, window=window: form_checks(
                _window_or_refuse(inside, window), predict_at=predict_at, **kwargs
            ),
            "second functional form or expanding-window backtest",
        )
        ratio = token_ratio(
            group, confidence=confidence, past_plateau=None if window["fallback"] else window["budgets"]
        )
        sentences.extend(label + s for s in ratio["sentences"])
        by_tokens.append(
            {
                "params": size,
                **entry,
                "measured": measured,
                "fit_window": window,
                "token_ratio": ratio,
                "forms": forms,
            }
        )
    by_params = []
    params_reason = None
    if len(sizes) < 2 or None in sizes:
        params_reason = (
            "the runs have one model size" if len(sizes) < 2 else "some runs give no parameter count"
        )
    else:
        for ratio, group in groups_by_tokens_per_param(observations):
            label = f"{stats.fmt(ratio)} tokens per parameter: "
            entry = _try(
                label,
                sentences,
                lambda group=group: analyse(group, x_name="params", horizon=params_horizon, **kwargs),
                "fit against parameters",
            )
            by_params.append({"tokens_per_param": ratio, **entry})
    return strict_json(
        {
            "method": (
                f"L = E + B·x^(−β) per interface, Huber (δ = {HUBER_DELTA:g}) on log loss, L-BFGS from a grid "
                f"of starts; {100 * confidence:g}% expanded percentile intervals over resamples of seeds (the same "
                f"draw for every interface: every multiset with its probability where there are at most {n_boot}, "
                f"else {n_boot} random draws, RNG seed {seed}); each fit checked against its points; backtest "
                f"without the largest budget, its error's interval from the same seed resamples, or with fewer than "
                f"{PER_SEED_BELOW} seeds from each seed's own refit and a t interval on S − 1 df; against tokens, on the budgets of the fit window, with a second form "
                "L = E + B·(D + D0)^(−β) and expanding-window backtests of both"
            ),
            # the spec this call was given: `scaling_report(observations, ScalingReportSpec(**arguments))`
            # recomputes the whole report from its shipped observations, bit for bit
            "arguments": {
                "pairs": None if pairs is None else [list(pair) for pair in pairs],
                "predict_at": [float(x) for x in predict_at],
                "horizon": float(horizon),
                "params_horizon": float(params_horizon),
                "n_boot": n_boot,
                "seed": seed,
                "confidence": confidence,
                "unigram": unigram,
                "unigram_unavailable": unigram_unavailable,
                "plateau_margin": plateau_margin,
            },
            "tokens": by_tokens,
            "params": by_params,
            "params_reason": params_reason,
            "sentences": sentences,
        }
    )


def _window_or_refuse(observations: list[Observation], window: dict) -> list[Observation]:
    if not observations:
        raise ValueError(
            f"no budget is past the unigram plateau ({window['rule']}: {window['unigram_baseline']:.4f} nats/token)"
        )
    return observations


def _try(label: str, sentences: list[str], fit, what: str) -> dict:
    try:
        result = fit()
    except ValueError as error:
        sentences.append(f"{label}{'n' if label else 'N'}o {what}: {error}.")
        return {"refused": str(error)}
    sentences.extend(label + s for s in result["sentences"])
    return {"refused": None, **result}
