"""``report.md`` from the report dict (``tablefree.report.assemble``): pure text, no file access."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tablefree.analysis.frequency_bands import frequency_bands_markdown
from tablefree.analysis.sweep import sweep_analysis_markdown
from tablefree.evaluate.validation import format_coverage
from tablefree.report.comparison import UNIGRAM_FLAG, VAL_LOSS, few_seeds_sentence
from tablefree.report.scaling_markdown import EVALUATION_NAME, fitted_curves_section
from tablefree.stats import fmt
from tablefree.units import human

ESTIMATE_NAME = "in-training validation estimate"


def render_markdown(report: dict[str, Any]) -> str:
    sections = [
        _header(report),
        _verdict(report),
        _baseline(report),
        _params(report),
        _regime(report),
        _metrics(report),
        _statistics(report),
        _gap(report),
        _grid(report),
        _frequency_bands(report),
        _learning_rate(report),
        fitted_curves_section(report),
        _figures(report),
        _analysis(report),
        _runs(report),
        _provenance(report),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def summary_counts(report: dict[str, Any]) -> tuple[int, int, int]:
    """(resolved, tested, at chance) over the report's comparisons: an at-chance benchmark is not tested."""
    comps = report["statistics"]["comparisons"]
    resolved = sum(c["verdict"] == "resolved" for c in comps)
    chance = sum(c["verdict"] == "at chance" for c in comps)
    return resolved, len(comps) - chance, chance


def _label(point: str) -> str:
    return f"[{point}] " if point else ""


def _header(report: dict[str, Any]) -> str:
    runs = report["runs"]
    # the runs every table is built from (comparison.finished), the count `--status` gives too
    done = (report.get("accounting") or {}).get("finished", sum(r["state"] == "done" for r in runs))
    points = [p["name"] for p in report["points"] if p["name"]]
    lines = [
        f"# Interface comparison: {report['name']}",
        "",
        _config_and_data(report),
        "",
        f"Interfaces: {', '.join(report['interfaces'])}; seeds: {', '.join(map(str, report['seeds']))}; "
        + (f"grid points: {', '.join(points)}; " if points else "")
        + f"{done} of {len(runs)} runs finished. Generated {report['created']} by `tablefree report`.",
    ]
    lines += _accounting(report.get("accounting"))
    valset = report.get("validation_set")
    if valset:
        documents = f"{valset['documents']} documents, " if valset.get("documents") else ""
        lines.append(
            f"\nThe validation loss is the evaluation over the validation split ({documents}"
            f"{human(valset['tokens'])} tokens); the trainer's {ESTIMATE_NAME} (a few batches, every `val_every` "
            "steps) is a different, noisier number used only for the curves."
        )
        left_out = format_coverage({"coverage": valset.get("coverage")})
        if left_out:
            lines.append(f"\n**Not the whole validation split.** {left_out}.")
    if points and report.get("primary_point") and report["primary_point"] != points[-1]:
        lines.append(
            f"\nThe Parameters and Results tables are at grid point {report['primary_point']}, the last one at "
            f"which every interface finished a run (not {points[-1]})."
        )
    for row in (r for r in runs if r["state"] == "failed"):
        lines.append(f"\n**Run {row['name']} failed**: {row['error'] or 'see its error.txt'}")
    lines += [f"\n> {note}" for note in report["config"].get("notes") or []]
    named = {row["run"] for row in (report.get("accounting") or {}).get("done_not_finished") or []}
    missing = [r["name"] for r in runs if r["state"] not in ("done", "failed") and r["name"] not in named]
    if missing:
        lines.append(
            f"\nNot finished yet: {', '.join(missing)} (re-run the same `tablefree compare` command)."
        )
    return "\n".join(lines)


def _accounting(accounting: dict[str, Any] | None) -> list[str]:
    """The finished runs the report did not use everywhere, each named with the reason and what it is out of."""
    if not accounting:
        return []
    lines = []
    not_used = accounting.get("done_not_finished") or []
    if not_used:
        lines.append(
            "\n**Marked done but not finished, so in none of the tables** (re-run the same `tablefree compare` "
            "command to finish them):"
        )
        lines += [f"- {row['run']}: {row['reason']}." for row in not_used]
    left = accounting["left_out"]
    if left:
        used = accounting["finished"] - len({row["run"] for row in left})
        lines.append(
            f"\n**Used in every part: {used} of the {accounting['finished']} finished runs.** Left out of a part:"
        )
        lines += [f"- {row['run']}: {row['reason']}; left out of {row['left_out_of']}." for row in left]
    return lines


def _config_and_data(report: dict[str, Any]) -> str:
    """Which config and which data: the dataset as the runs used it (its manifest), not the config's default."""
    config = report["config"]
    source = (
        f"config `{config['config_file']}`" if config.get("config_file") else f"config `{report['name']}`"
    )
    data = config.get("dataset") or {}
    if "tokenizer_hash" not in data:
        return f"From {source} on the dataset `{data.get('dir')}` (its manifest was not read)."
    corpus = data.get("corpus")
    sources = data.get("sources") or []
    count = f"{len(sources)} source{'s' if len(sources) != 1 else ''}"
    names = ", ".join(f"`{Path(path).name}`" for path in corpus or [])  # no local absolute path in a report
    origin = f"prepared from {names}: {count}" if corpus else count
    return (
        f"From {source} on the dataset `{data['dir']}` ({origin}; tokenizer `{str(data['tokenizer_hash'])[:12]}`, "
        f"vocabulary {data.get('vocab_size')}); the shards' sha256 are under Provenance."
    )


def _verdict(report: dict[str, Any]) -> str:
    comps = report["statistics"]["comparisons"]
    if not comps:
        return ""
    resolved, tested, chance = summary_counts(report)
    lines = [
        "## Verdict",
        "",
        f"{resolved} of {tested} comparisons resolved"
        + (f" ({chance} more at chance on a benchmark: no verdict)" if chance else "")
        + f". One test per question and compared pair ({_pairs_compared(report)}): the validation loss "
        "(perplexity and bits per byte are transformations of it) and each benchmark's headline metric; paired by "
        "seed; Holm's correction across those pairs, per question.",
        "",
    ]
    caveat = report["statistics"].get("few_seeds")
    if caveat:
        lines += [few_seeds_sentence(caveat), ""]
    for c in comps:
        lines.append(f"- {_label(c['point'])}**{c['metric']}**, {c['a']} vs {c['b']}: {c['sentence']}")
    return "\n".join(lines)


def _pairs_compared(report: dict[str, Any]) -> str:
    """Which pairs form Holm's family: all of them, or those with a control interface (compare's baselines)."""
    controls = report.get("controls") or []
    if not controls:
        return "every pair of interfaces"
    return "the pairs that include " + " or ".join(f"`{name}`" for name in controls)


def _baseline(report: dict[str, Any]) -> str:
    base = report.get("baseline")
    if not base:
        return ""
    lines = [
        "## Baseline",
        "",
        f"A unigram model fit on the training split ({human(base['train_tokens'])} tokens, add-½ smoothing) "
        f"scores **{base['val_loss']:.4f} nats/token** on "
        + (
            f"the {human(base['val_tokens'])} validation tokens the runs were scored on"
            if base.get("same_tokens_as_runs")
            else f"the whole validation split ({human(base['val_tokens'])} tokens; the runs' results do not "
            "say which tokens they scored: evaluate them again)"
        )
        + ". A model that has not beaten it has learned no more than token frequencies.",
    ]
    if base["not_beaten_by"]:
        lines += ["", f"**{UNIGRAM_FLAG}**: {', '.join(base['not_beaten_by'])}."]
    else:
        lines += ["", "Every finished run is below it."]
    return "\n".join(lines)


def _params(report: dict[str, Any]) -> str:
    if not report["params"]:
        return ""
    lines = [
        "## Parameters",
        "",
        "| interface | input interface | trainable total | learned-table total | removed vs learned | removed % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for interface, p in report["params"].items():
        lines.append(
            f"| {interface} | {p.get('input_interface', 0):,} | {p.get('total_trainable', 0):,} | "
            f"{p.get('learned_total', 0):,} | {p.get('removed_vs_learned', 0):,} | "
            f"{p.get('removed_percent', 0.0):.2f}% |"
        )
    return "\n".join(lines)


def _num(value: float | None, digits: int = 5) -> str:
    """``digits`` significant digits (7.9910 → 7.991, 2954.17 → 2954.2, 0.0553 → 0.0553)."""
    return "–" if value is None else f"{value:.{digits}g}"


def _metrics(report: dict[str, Any]) -> str:
    interfaces = report["interfaces"]
    lines = [
        "## Results",
        "",
        "Mean ± sample std over seeds (one seed: its value alone); each seed's value in brackets. ↑ higher is "
        "better, ↓ lower is better.",
    ]
    for point in report["points"]:
        table = point["metrics"]
        if not table:
            continue
        lines += ["", f"**{point['name']}**" if point["name"] else ""]
        lines += ["| metric | " + " | ".join(interfaces) + " |", "|---|" + "---|" * len(interfaces)]
        for name, entry in table.items():
            arrow = "↑" if entry["higher_is_better"] else "↓"
            cells = []
            for interface in interfaces:
                cell = entry["per_interface"].get(interface)
                if cell is None:
                    cells.append("–")
                    continue
                seeds = ", ".join(f"s{s}: {_num(v)}" for s, v in sorted(cell["values"].items()))
                spread = f" ± {_num(cell['std'], 2)}" if cell["std"] is not None else ""
                cells.append(f"{_num(cell['mean'])}{spread} [{seeds}]")
            lines.append(f"| {name} {arrow} | " + " | ".join(cells) + " |")
    if len(lines) == 3:
        return "## Results\n\nNo finished runs yet."
    return "\n".join(line for line in lines if line is not None)


def _statistics(report: dict[str, Any]) -> str:
    st = report["statistics"]
    if not st["comparisons"]:
        return ""
    lines = [
        "## Statistics",
        "",
        "Differences A − B, paired by seed (runs with one seed share initialisation and batch order): the mean "
        "of the per-seed differences with a 95% interval, the wider of the paired t on the seeds alone (S − 1 "
        "degrees of freedom) and the t that adds the sampling of the evaluation set (a cluster bootstrap over "
        f"validation documents or benchmark examples, the same draws for both interfaces; "
        f"{st['bootstrap_replicates']} replicates, fixed RNG seed). p-values (the larger of the two tests') are "
        f"Holm-adjusted, per question, across {_pairs_compared(report)}. A benchmark where neither interface is "
        'distinguishable from chance gets no verdict. "80% power at" is a power figure, not a bound: the true '
        "difference this design would resolve with 80% probability at the comparison's Holm step, with its 95% "
        "range from the uncertainty of the estimated standard error; only the interval rules differences out. "
        "Method details: docs/experiments.md.",
        "",
        "| metric | A − B | difference | 95% CI (the wider of seed t and seed-and-document t) | seeds | "
        "documents/examples | p (Holm over the pairs) | 80% power at (range) "
        "| conclusion |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in st["comparisons"]:
        ci = f"[{fmt(c['low'])}, {fmt(c['high'])}]" if c["low"] is not None else "–"
        p = c["adjusted_p"] if c["adjusted_p"] is not None else c["p_value"]
        lines.append(
            f"| {_label(c['point'])}{c['metric']} | {c['a']} − {c['b']} | {fmt(c['estimate'])} | {ci} | "
            f"{c['seeds']} | {c['clusters']} | {'–' if p is None else fmt(p, 2)} | "
            f"{_power(c.get('detectable'))} | {c['verdict']} |"
        )
    transformed = [c for c in st["comparisons"] if c.get("transformations")]
    if transformed:
        lines += [
            "",
            "The same validation comparisons as perplexity ratios and bits per byte (not separate tests):",
            "",
        ]
        for c in transformed:
            t = c["transformations"]
            ratio = _triple(t["ppl_ratio"], "×")
            bpb = f"; bits per byte {_triple(t['bits_per_byte'], '')}" if t.get("bits_per_byte") else ""
            lines.append(f"- {_label(c['point'])}{c['a']} − {c['b']}: perplexity {ratio}{bpb}")
    methods = sorted({c["method"] for c in st["comparisons"]})
    lines += ["", "Methods used: " + "; ".join(methods) + "."]
    return "\n".join(lines)


def _power(power: dict[str, Any] | None) -> str:
    if not isinstance(power, dict) or not power.get("value"):
        return "–"
    return f"{fmt(power['value'], 2)} ({fmt(power['low'], 2)}–{fmt(power['high'], 2)})"


def _triple(values: list[float | None], prefix: str) -> str:
    estimate, low, high = values
    interval = f" (95% CI [{prefix}{fmt(low)}, {prefix}{fmt(high)}])" if low is not None else ""
    return f"{prefix}{fmt(estimate)}{interval}"


def _gap(report: dict[str, Any]) -> str:
    gaps = report["statistics"]["gap"]
    if not gaps:
        return ""
    lines = [
        "## The gap as training grows",
        "",
        f"The paired difference A − B of the trainer's {ESTIMATE_NAME} at each evaluation during training "
        "(figure `gap.png`, band: 95% interval over seeds), and the slope of that gap against log tokens over "
        "the last doubling of training, per doubling of tokens, with its 95% interval over seeds. A gap that "
        "moves toward 0 is shrinking. A trend is read only from at least 5 evaluation points spanning at least "
        "one doubling of tokens; with fewer the row says why it is absent.",
        "",
        "| pair | seeds | gap at the end | slope per doubling (last doubling) | 95% t interval over seeds | reading |",
        "|---|---:|---:|---:|---|---|",
    ]
    for g in gaps:
        trend = g.get("trend")
        if not trend:
            why = g.get("no_trend") or "too few points"
            last = g["curve"][-1]["estimate"] if g.get("curve") else None
            lines.append(
                f"| {_label(g['point'])}{g['a']} − {g['b']} | {g['seeds']} | "
                f"{'–' if last is None else fmt(last)} | – | – | no trend: {why} |"
            )
            continue
        ci = f"[{fmt(trend['low'])}, {fmt(trend['high'])}]" if trend["low"] is not None else "–"
        lines.append(
            f"| {_label(g['point'])}{g['a']} − {g['b']} | {g['seeds']} | {fmt(trend['final_gap'])} | "
            f"{fmt(trend['slope_per_doubling'])} | {ci} | {trend['reading']} |"
        )
    return "\n".join(lines)


def _grid(report: dict[str, Any]) -> str:
    rows = report["statistics"]["grid"]
    if not rows:
        return ""
    interfaces = report["interfaces"]
    lines = [
        "## Grid",
        "",
        f"Per grid point: mean {EVALUATION_NAME} per interface (tokens, trainable parameters), and each pair's "
        "paired gap with its 95% interval (figure `scaling.png`).",
        "",
        "| point | " + " | ".join(interfaces) + " | gaps (95% CI as in Statistics, Holm over the pairs) |",
        "|---|" + "---|" * len(interfaces) + "---|",
    ]
    for row in rows:
        cells = []
        for interface in interfaces:
            cell = row["interfaces"].get(interface)
            cells.append(
                "–"
                if cell is None
                else f"{cell['val_loss']:.4f} ({human(cell['tokens'])} tok, {human(cell['params'])} params)"
            )
        gaps = "; ".join(
            f"{g['a']} − {g['b']} {fmt(g['estimate'])}"
            + (f" [{fmt(g['low'])}, {fmt(g['high'])}]" if g["low"] is not None else "")
            + f" {g['verdict']}"
            for g in row["gaps"]
        )
        lines.append(f"| {row['point']} | " + " | ".join(cells) + f" | {gaps} |")
    return "\n".join(lines)


def _regime(report: dict[str, Any]) -> str:
    rows = report.get("regime") or []
    if not rows:
        return ""
    lines = [
        "## Regime",
        "",
        "Where this sweep sits beside the studies it follows (parameters of the learned model, table included). "
        "Gaps measured here need not hold where these numbers differ by orders of magnitude.",
        "",
        "| | training tokens | trainable parameters | tokens per parameter | table share | K / d |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['study']} | {human(row['tokens'])} | {human(row['params_learned'])} | "
            f"{row['tokens_per_param']:.3g} | {100 * row['table_share']:.1f}% | "
            f"{row['code_bits']} / {row['d_model']} = {100 * row['bits_per_width']:.1f}% |"
        )
    return "\n".join(lines)


def _learning_rate(report: dict[str, Any]) -> str:
    checks = report["statistics"].get("learning_rate") or []
    if not checks:
        return ""
    lines = ["## Learning rate per interface"]
    for check in checks:
        rates = check["rates"]
        lines += [
            "",
            f"Grid points {', '.join(check['points'])}. Each interface's rate is chosen on "
            f"{check['selection']['description']}: the mean over seeds, lowest wins. The verdict's validation "
            "split is not used for the choice"
            + (
                "." if check["selection"]["disjoint_from_verdict"] else " apart from what the estimate reads."
            ),
            "",
            "| interface | " + " | ".join(f"lr {rate:g}" for rate in rates) + " | chosen |",
            "|---|" + "---|" * len(rates) + "---|",
        ]
        too_small = check["selection"].get("too_small")
        if too_small:  # ranked, but not a choice: no bold rate and no gap at each interface's own rate
            lines[-2:-2] = [f"**The selection split is too small to choose a rate on**: {too_small}.", ""]
        for interface, cell in check["per_interface"].items():
            values = []
            for rate in rates:
                entry = cell["rates"].get(rate)
                values.append(
                    "–"
                    if entry is None
                    else f"{entry['mean']:.4f}"
                    + (f" ± {entry['std']:.4f}" if entry["std"] is not None else "")
                    + f" ({entry['n']} seed{'s' if entry['n'] != 1 else ''})"
                )
            edge = " (at the grid's edge: the best rate may lie beyond it)" if cell["at_edge"] else ""
            chosen = (
                f"lowest {cell['chosen']:g}, not chosen" if too_small else f"**{cell['chosen']:g}**{edge}"
            )
            lines.append(f"| {interface} | " + " | ".join(values) + f" | {chosen} |")
        shared = check["shared_rate"]
        if shared is None or too_small:
            continue
        lines += [
            "",
            f"Each pair's validation-loss gap at the best shared rate ({shared:g}, lowest mean over the "
            "interfaces) and with each interface at its own chosen rate (Holm over the pairs within each column):",
            "",
            "| pair | at the shared rate (95% CI as in Statistics) | at each interface's own rate (the same) |",
            "|---|---|---|",
        ]
        own = {(c["a"], c["b"]): c for c in check["comparisons"]["own"]}
        for c in check["comparisons"]["shared"]:
            tuned = own.get((c["a"], c["b"]))
            rate_a = f"{check['per_interface'][c['a']]['chosen']:g}"
            rate_b = f"{check['per_interface'][c['b']]['chosen']:g}"
            lines.append(
                f"| {c['a']} − {c['b']} | {_gap_cell(c)} | "
                + (
                    "–"
                    if tuned is None
                    else f"{_gap_cell(tuned)} ({c['a']} at {rate_a}, {c['b']} at {rate_b})"
                )
                + " |"
            )
    return "\n".join(lines)


def _gap_cell(c: dict[str, Any]) -> str:
    interval = f" [{fmt(c['low'])}, {fmt(c['high'])}]" if c["low"] is not None else ""
    return (
        f"{fmt(c['estimate'])}{interval}, {c['verdict']} ({c['seeds']} seed{'s' if c['seeds'] != 1 else ''})"
    )


def _figures(report: dict[str, Any]) -> str:
    figures = report.get("figures") or []
    if not figures:
        return ""
    lines = ["## Figures", ""]
    for figure in figures:
        lines += [f"![{figure['title']}]({figure['path']})", ""]
    return "\n".join(lines).rstrip()


def _analysis(report: dict[str, Any]) -> str:
    return sweep_analysis_markdown(report.get("analysis"))


def _frequency_bands(report: dict[str, Any]) -> str:
    return frequency_bands_markdown(report.get("frequency_bands") or []).rstrip()


def _runs(report: dict[str, Any]) -> str:
    lines = [
        "## Runs",
        "",
        f"| run | state | tokens | train wall time | tokens/s | eval wall time | final train loss | final "
        f"{ESTIMATE_NAME} | {EVALUATION_NAME} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    branched = [r for r in report["runs"] if r.get("branched_at_step")]
    for r in report["runs"]:
        name = r["name"] + (f" (branch, step {r['branched_at_step']})" if r.get("branched_at_step") else "")
        lines.append(
            f"| {name} | {r['state']} | {_int(r['tokens_seen'])} | {_seconds(r['train_wall_s'])} | "
            f"{_int(r['tokens_per_s'])} | {_seconds(r['eval_wall_s'])} | {_num(r['final_train_loss'])} | "
            f"{_num(r['final_val_estimate'])} | {_num(r['metrics'].get(VAL_LOSS))} |"
        )
    if branched:
        lines += [
            "",
            f"A branch (here {len(branched)} runs) resumes its trunk's checkpoint at the step named and trains its "
            "own decay: its train wall time and tokens/s include the trunk's training up to that step.",
        ]
    return "\n".join(lines)


def _int(value: float | None) -> str:
    return "–" if value is None else f"{round(value):,}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _provenance(report: dict[str, Any]) -> str:
    git = report["git"]
    commit = git.get("commit") or f"unknown (tablefree {git.get('version')})"
    env = report["environment"]
    device = env.get("gpu", "CPU")
    lines = [
        "## Provenance",
        "",
        f"- git commit: `{commit}`" + (" (with uncommitted changes)" if git.get("dirty") else ""),
        f"- environment: Python {env['python']}, torch {env['torch']}, device {device}, "
        f"{env['cpu_count']} CPUs ({env['torch_threads']} torch threads), {env['platform']}",
        "",
        "Sweep config (`compare.yaml`, with the dataset as used):",
        "",
        "```yaml",
        yaml.safe_dump(report["config"], sort_keys=False).rstrip(),
        "```",
    ]
    if report["train_config"]:
        lines += [
            "",
            "Resolved training config of the first run (the other runs differ only in interface and seed"
            + (", and in the grid point's settings" if len(report["points"]) > 1 else "")
            + "):",
            "",
            "```yaml",
            yaml.safe_dump(report["train_config"], sort_keys=False).rstrip(),
            "```",
        ]
    return "\n".join(lines)
