"""The budget study's section of ``report.md`` (``scaling_report``'s results, ``report.curves``): the schedule
and branching of each group of budgets, the measured steps, the fit window, the token ratio, the second form and
the expanding-window backtests as tables, each naming its interval, then the fits' sentences; and the answer to
``--predict-at``. Pure text, no file access."""

from __future__ import annotations

import math
from typing import Any

from tablefree.scaling.window import window_sentence
from tablefree.stats import fmt, fmt_p
from tablefree.units import human

EVALUATION_NAME = "validation loss (evaluation over the validation split)"


def fitted_curves_section(report: dict[str, Any]) -> str:
    """The section of a sweep with a budget grid: per group the schedule and branching, the measured steps, the
    fit window, the token ratio, the second form and the backtests, then the fits' sentences."""
    entries = report["statistics"].get("fitted_curves") or []
    if not entries:
        return ""
    lines = ["## Budgets as separate runs: fitted curves"]
    for entry in entries:
        schedule, branching = entry["schedule"] or {}, entry["branching"]
        lines += [
            "",
            f"Grid points {', '.join(entry['points'])}: every number below is the final {EVALUATION_NAME} of a "
            f"separate run with its own complete `{schedule.get('name')}` schedule (peak rate "
            f"{schedule.get('peak_lr') or 0:g}, warmup {schedule.get('warmup_steps')} steps"
            + (
                f", decay over the last {100 * schedule['decay_fraction']:g}% of each budget's steps to "
                f"{schedule.get('min_lr') or 0:g}"
                if schedule.get("name") == "wsd"
                else ""
            )
            + "), not a point inside one run's learning-rate decay.",
            "",
            "| budget | tokens | steps | trained as |",
            "|---|---:|---:|---|",
        ]
        for point, row in branching["points"].items():
            branched, runs = row.get("branched", 1 if row["branched_from"] else 0), row.get("runs")
            how = (
                f"branched from the {row['branched_from']} run at step {row['decay_from_step']}, its own decay after it"
                if row["branched_from"]
                else "from scratch"
            )
            if runs and 0 < branched < runs:
                how = f"{branched} of {runs} runs {how}; {runs - branched} from scratch"
            lines.append(f"| {point} | {human(row['tokens'])} | {row['steps']} | {how} |")
        if branching["saving"] > 0:
            lines += [
                "",
                f"Branching trained {human(branching['tokens_trained'])} tokens for runs that take "
                f"{human(branching['tokens_from_scratch'])} from scratch ({100 * branching['saving']:.0f}% fewer); "
                "a branch is bit-identical to its from-scratch run (docs/experiments.md).",
            ]
        fits = entry["fits"]
        tabled: set[str] = set()
        for group in fits["tokens"]:
            label = (
                f" ({human(group['params'])} parameters)"
                if len(fits["tokens"]) > 1 and group["params"]
                else ""
            )
            lines += _measured_table(group.get("measured"), label)
            lines += _window_table(group.get("fit_window"), label)
            lines += _token_ratio_tables(group.get("token_ratio"), label)
            lines += _forms_tables(group.get("forms"), label)
            tabled |= set((group.get("measured") or {}).get("sentences", []))
            tabled |= set((group.get("token_ratio") or {}).get("sentences", []))
        lines += ["", f"**Fitted.** Method: {fits['method']}.", ""]
        lines += [f"- {line}" for line in predict_at_lines(fits)]
        lines += [f"- {s}" for s in fits["sentences"] if not any(s.endswith(t) for t in tabled)]
        if fits.get("params_reason"):
            lines.append(f"- No fit against parameters: {fits['params_reason']}.")
    return "\n".join(lines)


def predict_at_lines(fits: dict[str, Any], requested: list[float] | None = None) -> list[str]:
    """The answer to the budgets the fits were asked to predict at (``scaling_report``'s ``predict_at``, or
    ``requested``): per fit against tokens the predicted gaps, said to be no result where the fit fails its
    checks, or the fit's refusal with its reason. Nothing when no budget was requested."""
    requested = requested if requested is not None else fits["arguments"]["predict_at"]
    if not requested:
        return []
    asked = ", ".join(human(x) for x in requested)
    lines = []
    for group in fits["tokens"]:
        size = (
            f" ({human(group['params'])} parameters)" if len(fits["tokens"]) > 1 and group["params"] else ""
        )
        if group.get("refused"):
            lines.append(
                f"Predictions at {asked} tokens{size}: none, the fit is refused: {group['refused']}."
            )
            continue
        caveat = []
        if not group.get("describes_points"):
            caveat.append("the fitted curves do not describe their points")
        if not all(p["backtest"]["covered"] for p in group["pairs"]):
            caveat.append("a backtest failed")
        note = f" (not a result: {' and '.join(caveat)})" if caveat else ""
        for pair in group["pairs"]:
            for g in pair["gap_at"]:
                if g["x"] in requested:
                    lines.append(
                        f"Predicted {pair['a']} − {pair['b']} at {human(g['x'])} tokens{size}: {fmt(g['estimate'])} "
                        f"nats/token (95% expanded percentile over seed resamples [{fmt(g['low'])}, {fmt(g['high'])}]; "
                        f"{g['reach']:,.0f}× beyond the largest budget){note}."
                    )
    return lines


def predict_at_answer(report: dict[str, Any], requested: list[float] | None) -> list[str]:
    """``predict_at_lines`` for every budget grid of the report, or why nothing was predicted: the command line's
    ``--predict-at`` is always answered."""
    if not requested:
        return []
    entries = report["statistics"].get("fitted_curves") or []
    if not entries:
        return [
            f"Predictions at {', '.join(human(float(x)) for x in requested)} tokens: none, this sweep has no budget "
            "grid with two or more finished budgets to fit (grid points that set train.budget)."
        ]
    return [
        line for entry in entries for line in predict_at_lines(entry["fits"], [float(x) for x in requested])
    ]


def _measured_table(measured: dict[str, Any] | None, label: str) -> list[str]:
    if not measured or not measured.get("steps"):
        return []
    level = f"{100 * measured['confidence']:g}%"
    lines = [
        "",
        f"**Measured across separate runs, no fit{label}**: each step's change of the gap A − B, paired by seed. "
        f'A reading other than "not resolved" needs Holm\'s adjusted p below {1 - measured["confidence"]:g} '
        'with 3 or more seeds; "changed sign" also needs the new gap\'s own t interval to exclude 0.',
        "",
        f"| A − B | step | gap before | change ({level} t interval over seeds, per step) | "
        f"p ({measured.get('correction', 'Holm over the steps of this table')}) | seeds | reading |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for row in measured["steps"]:
        interval = f" [{fmt(row['low'])}, {fmt(row['high'])}]" if row["low"] is not None else ""
        p = row.get("adjusted_p")
        lines.append(
            f"| {row['a']} − {row['b']} | {human(row['from'])} → {human(row['to'])} | {fmt(row['gap_from'])} | "
            f"{row['change']:+.3g}{interval} | {'–' if p is None else fmt_p(p)} | {row['seeds']} | {row['reading']} |"
        )
    return lines


def _window_table(window: dict[str, Any] | None, label: str) -> list[str]:
    if not window:
        return []
    lines = ["", f"**{label.strip(' ()') + ': ' if label else ''}{window_sentence(window)}**"]
    if window["per_budget"]:
        lines += [
            "",
            f"| budget | runs | worst run | its loss − the unigram baseline ({window['unigram_baseline']:.4f}) | "
            f"runs within {window['margin']:g} nats/token of it or above |",
            "|---|---:|---|---:|---|",
        ]
        for row in window["per_budget"]:
            lines.append(
                f"| {human(row['tokens'])} | {row['runs']} | {row['worst_run']} | {-row['below_baseline_by']:+.4f} | "
                f"{', '.join(row['on_plateau']) or 'none'} |"
            )
    return lines


def _token_ratio_tables(ratio: dict[str, Any] | None, label: str) -> list[str]:
    if not ratio:
        return []
    if ratio.get("refused"):
        return ["", f"**Token ratio{label}**: none ({ratio['refused']})."]
    lines = [
        "",
        f"**Token ratio{label}, no fit.** {ratio['definition'][0].upper()}{ratio['definition'][1:]}.",
    ]
    for code in ratio["codes"]:
        plateau = any("past_plateau" in row for row in code["budgets"])
        lines += [
            "",
            f"| {ratio['reference']} vs {code['code']}: budget | ratio ({ratio['interval']}) | the table is worth "
            "(1/ratio, same interval) | seeds |" + (" past the plateau |" if plateau else ""),
            "|---|---|---|---:|" + ("---|" if plateau else ""),
        ]
        for row in code["budgets"]:
            if row["estimate"] is not None:
                interval = f" [{fmt(row['low'])}, {fmt(row['high'])}]" if row["low"] is not None else ""
                worth = (
                    f" [{fmt(row['worth_low'])}, {fmt(row['worth_high'])}]" if row["low"] is not None else ""
                )
                cells = f"{fmt(row['estimate'])}{interval} | ×{fmt(row['worth'])}{worth}"
            elif row["bound"] is not None:
                side = "above" if row["bound"] == "<" else "below"
                inverse = ">" if row["bound"] == "<" else "<"
                cells = (
                    f"{row['bound']} {fmt(row['bound_value'])} (the loss lies {side} the learned curve: a bound) | "
                    f"{inverse} ×{fmt(1 / row['bound_value'])}"
                )
            else:
                cells = "– (outside the learned curve on both sides) | –"
            past = (" yes |" if row.get("past_plateau") else " no |") if plateau else ""
            lines.append(f"| {human(row['tokens'])} | {cells} | {row['seeds']} |{past}")
        steps = [s for s in code["steps"] if s["change"] is not None]
        if steps:
            lines += [
                "",
                f"| {code['code']}: step | ratio's change per doubling ({ratio['step_interval']}) | p (Holm) | "
                "seeds | reading |",
                "|---|---|---:|---:|---|",
            ]
            for s in steps:
                interval = f" [×{fmt(math.exp(s['low']))}, ×{fmt(math.exp(s['high']))}]"
                p = s.get("adjusted_p")
                lines.append(
                    f"| {human(s['from'])} → {human(s['to'])} | ×{fmt(s['factor'])}{interval} | "
                    f"{'–' if p is None else fmt_p(p)} | {s['seeds']} | {s['reading']} |"
                )
        lines += [f"\n{s}" for s in code["sentences"] if s.startswith("From ")]
    return lines


def _forms_tables(forms: dict[str, Any] | None, label: str) -> list[str]:
    if not forms:
        return []
    if forms.get("refused"):
        return ["", f"**Second form and expanding-window backtests{label}**: none ({forms['refused']})."]
    lines = []
    second = forms["second_form"]
    if second.get("refused"):
        lines += ["", f"**The {second['form']} ({second['formula']}){label}**: no fit ({second['refused']})."]
    else:
        lines += [
            "",
            f"**The {second['form']} ({second['formula']}){label}**, the second form, fitted to "
            f"{', '.join(human(x) for x in second['budgets'])} tokens (parameters with their 95% expanded percentile "
            "interval over seed resamples; the check against its points as for the power law):",
            "",
            "| interface | E | B | β | D0 (tokens) | worst miss / its limit (× seed standard error) | describes its points |",
            "|---|---|---|---|---|---:|---|",
        ]
        for name, entry in second["interfaces"].items():
            f, a = entry["fit"], entry["adequacy"]
            cells = " | ".join(
                f"{f[k]['estimate']:.3g} [{f[k]['low']:.3g}, {f[k]['high']:.3g}]"
                if k != "D0"
                else f"{human(f[k]['estimate'])} [{human(f[k]['low'])}, {human(f[k]['high'])}]"
                for k in ("E", "B", "beta", "D0")
            )
            lines.append(
                f"| {name} | {cells} | {fmt(a['worst_ratio'], 2)} / {fmt(a['limit'], 2)} | "
                f"{'yes' if a['describes_points'] else 'no'} |"
            )
    methods = {
        c.get("method", "expanded percentile over seed resamples")
        for b in forms["expanding_backtests"]
        for w in b.get("windows") or []
        for c in w["checks"]
    }
    method = "; ".join(sorted(methods)) or "expanded percentile over seed resamples"
    lines += [
        "",
        f"**Expanding-window backtests{label}**: each form fitted on the first k budgets of the fit window, for every "
        "k from its number of parameters up, predicting every larger budget; a check passes when the error's 95% "
        f"interval ({method}; the observed mean's seed noise included) includes 0.",
        "",
        f"| form | fitted on | predicts | at | predicted | observed | error (95% interval: {method}) | check |",
        "|---|---|---|---|---:|---:|---|---|",
    ]
    for backtest in forms["expanding_backtests"]:
        if backtest["refused"]:
            lines.append(f"| {backtest['form']} | – | – | – | – | – | {backtest['refused']} | refused |")
            continue
        for window in backtest["windows"]:
            for c in window["checks"]:
                what = c.get("interface") or " − ".join(c["pair"])
                lines.append(
                    f"| {backtest['form']} | {window['budgets']} budgets, "
                    f"{human(window.get('fitted_from', 0)) + '–' if 'fitted_from' in window else 'to '}"
                    f"{human(window['fitted_up_to'])} | "
                    f"{what} | {human(c['at'])} | {fmt(c['predicted'])} | {fmt(c['observed'])} | "
                    f"{c['error']:+.3g} [{fmt(c['error_low'])}, {fmt(c['error_high'])}] | "
                    f"{'passed' if c['covered'] else 'failed'} |"
                )
    return lines
