"""The plain sentences of a fit: its check against its points, each pair's gap, slope, parity and backtest."""

from __future__ import annotations

from tablefree import stats
from tablefree.scaling.observations import Design
from tablefree.units import human


def window_phrase(first: float, last: float, budgets: int, unit: str = "tokens") -> str:
    """ "the 4 budgets from 525k to 4.2M tokens": the window a fit or backtest was fitted on."""
    return f"the {budgets} budgets from {human(first)} to {human(last)} {unit}"


def fit_sentence(result: dict, design: Design) -> str:
    """What the fit used: its window, its intervals, and its backtest's window and method."""
    unit = "tokens" if design.x_name == "tokens" else "parameters"
    x = result["budgets"]
    return (
        f"The fits of L = E + B·x^(−β) use {window_phrase(x[0], x[-1], len(x), unit)} and {len(result['seeds'])} "
        f"seeds, with {100 * result['confidence']:g}% {result['interval']} intervals over resamples of the seeds "
        f"({result['resamples']}); the backtest refits {window_phrase(x[0], x[-2], len(x) - 1, unit)} and "
        f"predicts {human(x[-1])}, its error's interval by {result['backtest_method']}."
    )


def adequacy_sentences(
    name: str, adequacy: dict, design: Design, formula: str = "L = E + B·x^(−β)"
) -> list[str]:
    unit = "tokens" if design.x_name == "tokens" else "parameters"
    sentences = []
    if not adequacy["describes_points"]:
        sentences.append(
            f"The fitted curve of {name} misses its mean loss at {human(adequacy['worst_at'])} {unit} by "
            f"{adequacy['worst_miss']:+.3g} nats/token, {stats.fmt(adequacy['worst_ratio'], 2)}× that mean's "
            f"seed standard error (the limit is {stats.fmt(adequacy['limit'], 2)}×): {formula} does not "
            "describe these points, so what the fits derive below (gaps, slopes, crossings) is not a result."
        )
    if adequacy["floor_at_zero"]:
        sentences.append(
            f"The fitted floor E of {name} went to 0: its curve is a pure power law, with no irreducible loss."
        )
    return sentences


def pair_sentences(pair: dict, design: Design, confidence: float) -> list[str]:
    a, b = pair["a"], pair["b"]
    unit = "tokens" if design.x_name == "tokens" else "parameters"
    level = f"{100 * confidence:g}% CI"
    largest = pair["backtest"]["at"]
    sentences = []
    for g in pair["gap_at"]:
        leader, trailer = (a, b) if g["estimate"] < 0 else (b, a)
        sign = -1.0 if g["estimate"] < 0 else 1.0
        low, high = sorted((sign * g["low"], sign * g["high"]))
        where = (
            "the largest budget run"
            if g["reach"] == 1
            else f"{ratio(g['reach'])} beyond the largest budget run"
            if g["reach"] > 1
            else "inside the budgets run"
        )
        includes = "; the interval includes 0" if low <= 0 <= high else ""
        sentences.append(
            f"At {human(g['x'])} {unit} ({where}) the fitted curves put {leader} ahead of {trailer} by "
            f"{num(abs(g['estimate']))} nats/token ({level} [{num(low)}, {num(high)}]{includes})."
        )
    c = pair["change_per_doubling"]
    gap_now = next(g for g in pair["gap_at"] if g["x"] == largest)["estimate"]
    gap_sign = 1.0 if gap_now >= 0 else -1.0
    magnitude = gap_sign * c["estimate"]
    verb, orient = ("shrinks", -gap_sign) if magnitude < 0 else ("grows", gap_sign)
    m_low, m_high = sorted((orient * c["low"], orient * c["high"]))  # in units of the verb: shrink or growth
    sentences.append(
        f"At {human(largest)} {unit} the fitted gap {verb} by {num(abs(magnitude))} nats/token per "
        f"doubling ({level} [{num(m_low)}, {num(m_high)}]"
        + ("; the interval includes 0)." if m_low <= 0 <= m_high else ").")
    )
    p = pair["parity"]
    if p["estimate"] is None:
        sentences.append(
            f"The fits do not cross before {human(p['horizon'])} {unit}; "
            f"{100 * p['share_crossing']:.0f}% of the seed resamples cross before it."
        )
    else:
        bounds = (
            f"[{human(p['low']) if p['low'] is not None else '–'}, "
            f"{human(p['high']) if p['high'] is not None else 'beyond ' + human(p['horizon'])}]"
        )
        reach = p["estimate"] / largest
        where = (
            f"{ratio(reach)} beyond the largest budget run"
            if reach > 1
            else "inside the budgets run, where the measured gaps at each budget say more than the fits"
        )
        sentences.append(
            f"The fits cross at {human(p['estimate'])} {unit} ({level} {bounds}), {where}; "
            f"{100 * p['share_crossing']:.0f}% of the seed resamples cross before {human(p['horizon'])}."
        )
    bt = pair["backtest"]
    checked = ratio(bt["at"] / bt["fitted_up_to"])
    verdict = (
        f"the error's interval includes 0, so the extrapolation has been checked over {checked}"
        if bt["covered"]
        else f"the error's interval excludes 0, so the extrapolation failed its check over {checked} and "
        "the fits' predictions beyond the budgets run are not results"
    )
    fitted = (
        f"fitted on {human(bt['fitted_from'])}–{human(bt['fitted_up_to'])}"
        if "fitted_from" in bt
        else f"fitted up to {human(bt['fitted_up_to'])}"
    )
    sentences.append(
        f"The backtest ({fitted}; {bt.get('method', 'expanded percentile over seed resamples')}) predicted a "
        f"gap of {num(bt['predicted'])} at {human(bt['at'])} ({level} [{num(bt['low'])}, {num(bt['high'])}]), "
        f"observed {num(bt['observed'])}: off by {num(bt['error'])} nats/token ({level} of the error, the "
        f"observed mean's seed noise included: [{num(bt['error_low'])}, {num(bt['error_high'])}]); {verdict}"
        + (
            f"; the prediction at {human(pair['gap_at'][-1]['x'])} reaches {ratio(pair['gap_at'][-1]['reach'])} "
            "beyond the largest budget run, beyond what was checked."
            if bt["covered"] and pair["gap_at"][-1]["reach"] > bt["at"] / bt["fitted_up_to"]
            else "."
        )
    )
    return sentences


def num(value: float) -> str:
    """Three significant digits; scientific notation only for magnitudes below 1e-4 (a backtest error of 3e-12)."""
    return f"{value:.2g}" if value != 0 and abs(value) < 1e-4 else stats.fmt(value)


def ratio(value: float) -> str:
    return f"{stats.fmt(value, 2) if value < 100 else f'{value:,.0f}'}×"


def backtest_sentences(result: dict) -> list[str]:
    """One sentence per window of an expanding-window backtest, or its refusal."""
    name = f"the {result['form']} ({result['formula']})"
    if result["refused"]:
        return [f"No expanding-window backtest of {name}: {result['refused']}."]
    sentences = []
    for window in result["windows"]:
        checks = window["checks"]
        worst = max(checks, key=lambda c: abs(c["error"]))
        what = worst.get("interface") or " − ".join(worst["pair"])
        first = f"{human(window['fitted_from'])} to " if "fitted_from" in window else ""
        method = worst.get("method", "expanded percentile over seed resamples")
        sentences.append(
            f"Backtest of {name} fitted on the first {window['budgets']} budgets ({first}"
            f"{human(window['fitted_up_to'])} tokens): {window['passed']} of {len(checks)} predictions of the "
            f"larger budgets (each interface's loss, each pair's gap) have an error interval that includes 0; the "
            f"largest error, {what} at {human(worst['at'])}, is {num(worst['error'])} nats/token "
            f"({100 * result['confidence']:g}% interval, {method}: "
            f"[{num(worst['error_low'])}, {num(worst['error_high'])}])."
        )
    return sentences
