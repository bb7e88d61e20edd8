"""The statistics of a sweep, from its run files: metric tables, the paired comparisons and their sentences, the
unigram baseline, the gap against tokens seen, and the grid summary. ``tablefree.stats`` does the arithmetic;
this module decides what is compared with what (see docs/experiments.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import fields, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from tablefree import stats
from tablefree.compat import ESTIMATE_KEYS
from tablefree.config_parsing import load_yaml
from tablefree.data.loader import read_manifest, split_shards
from tablefree.data.shards import open_shard
from tablefree.rundir import RUN_FILES, Run, first_number, read_jsonl
from tablefree.units import human

INTERFACE_ORDER = ["learned", "canonical", "affine"]
VALIDATION = "validation"
VAL_LOSS = "validation/val_loss"
VALIDATION_METRICS = ("val_loss", "val_ppl", "bits_per_byte")
UNIGRAM_FLAG = "still at unigram level: interface differences cannot show yet"


def higher_is_better(metric: str) -> bool:
    name = metric.split("/")[-1].lower()
    return not any(word in name for word in ("loss", "ppl", "perplexity", "bits_per_byte", "bpb"))


def ordered_interfaces(runs: Iterable[Run]) -> list[str]:
    present = {run.interface for run in runs}
    return [i for i in INTERFACE_ORDER if i in present] + sorted(present - set(INTERFACE_ORDER))


def ordered_points(runs: Iterable[Run], config: dict[str, Any]) -> list[str]:
    listed = [p["name"] for p in config.get("grid_points") or []]
    present = list(dict.fromkeys(run.point for run in runs))
    return [p for p in listed if p in present] + [p for p in present if p not in listed]


def finished(runs: Iterable[Run]) -> list[Run]:
    """The runs every part of the report is built from: status done, with a readable eval.json and a summary.json
    of a completed training, as ``--status`` counts a run done (``sweep.status.run_state``). A run without its
    summary has no tokens seen, so it would enter some tables and not others; it is left out of all of them."""
    return [run for run in runs if run.state == "done" and not_finished_because(run) is None]


def not_finished_because(run: Run) -> str | None:
    """Why a run whose status says done is not a finished run of the report, or None."""
    if run.eval is None:
        return f"{RUN_FILES['eval']} is missing or unreadable"
    if not run.summary:
        return f"{RUN_FILES['summary']} is missing or unreadable, so its tokens seen are unknown"
    if run.summary.get("completed") is False:
        return f"{RUN_FILES['summary']} records a training that did not complete"
    return None


def curve_cut_short(run: Run) -> str | None:
    """Why the run's in-training curve (metrics.jsonl) is shorter than its training, or None: a finished run
    logs its last step, so a last record before the step summary.json records was cut off (a truncated file)."""
    steps = (run.summary or {}).get("step") or (run.summary or {}).get("total_steps")
    if not steps:
        return None
    logged = [r["step"] for r in run.metrics_records() if isinstance(r.get("step"), int)]
    if not logged:
        return f"{RUN_FILES['metrics']} has no records though {RUN_FILES['summary']} records {steps} steps"
    if max(logged) < steps:
        return f"{RUN_FILES['metrics']} ends at step {max(logged)} of {steps} (cut short)"
    return None


def run_accounting(runs: list[Run]) -> dict[str, Any]:
    """What the report used: the runs finished (``finished``: the same set in every table, and the count
    ``--status`` gives), each run marked done that is not finished with the reason, and each finished run left
    out of the in-training curves because its curve was cut short."""
    done = finished(runs)
    left_out = []
    for run in done:
        cut = curve_cut_short(run)
        if cut:
            left_out.append(
                {"run": run.name, "reason": cut, "left_out_of": "the in-training curves and their gap"}
            )
    not_used = [
        {"run": run.name, "reason": not_finished_because(run)}
        for run in runs
        if run.state == "done" and not_finished_because(run) is not None
    ]
    return {
        "runs": len(runs),
        "finished": len(done),
        "done_not_finished": not_used,
        "left_out": left_out,
    }


# ------------------------------------------------------------------------------------------------------------
# Metric tables


def metric_table(runs: list[Run], interfaces: list[str]) -> dict[str, dict[str, Any]]:
    """Per metric: direction and, per interface, mean, sample std over seeds (None for one seed), each seed."""
    names: list[str] = []
    for run in runs:
        names += [name for name in run.metric_values() if name not in names]
    names.sort(key=_metric_sort_key)
    table = {}
    for name in names:
        per_interface = {}
        for interface in interfaces:
            values = {
                run.seed: run.metric_values()[name]
                for run in runs
                if run.interface == interface and name in run.metric_values()
            }
            if values:
                mean, std = stats.mean_std(list(values.values()))
                per_interface[interface] = {"mean": mean, "std": std, "n": len(values), "values": values}
        table[name] = {"higher_is_better": higher_is_better(name), "per_interface": per_interface}
    return table


def _metric_sort_key(name: str) -> tuple[int, str]:
    task, _, metric = name.partition("/")
    if task == VALIDATION:
        return (0, str(VALIDATION_METRICS.index(metric)) if metric in VALIDATION_METRICS else metric)
    return (1, name)


def headlines(runs: list[Run]) -> dict[str, str]:
    """Each benchmark's headline metric, as the evaluation results name it."""
    found: dict[str, str] = {}
    for run in runs:
        for task, result in ((run.eval or {}).get("tasks") or {}).items():
            if result.get("headline") and task != VALIDATION:
                found.setdefault(task, result["headline"])
    return found


def questions(runs: list[Run]) -> list[str]:
    """One metric per question: the validation loss (perplexity and bits per byte are transformations of it)
    and each benchmark's headline metric."""
    names = [VAL_LOSS] if any(VAL_LOSS in run.metric_values() for run in runs) else []
    return names + [f"{task}/{metric}" for task, metric in sorted(headlines(runs).items())]


def seed_cv(table: dict[str, dict[str, Any]], metric: str = "validation/val_ppl") -> dict[str, float | None]:
    """Seed-to-seed coefficient of variation of ``metric`` per interface (None with fewer than two seeds)."""
    entry = table.get(metric, {"per_interface": {}})
    return {
        interface: stats.coefficient_of_variation(list(cell["values"].values())) if cell["n"] > 1 else None
        for interface, cell in entry["per_interface"].items()
    }


# ------------------------------------------------------------------------------------------------------------
# Paired comparisons


def paired_runs(runs: list[Run], a: str, b: str) -> list[tuple[Run, Run]]:
    """(run of A, run of B) for every seed both interfaces finished, in seed order."""
    by_key = {(run.interface, run.seed): run for run in finished(runs)}
    seeds = sorted({s for (i, s) in by_key if i == a} & {s for (i, s) in by_key if i == b})
    return [(by_key[(a, s)], by_key[(b, s)]) for s in seeds]


def validation_difference(pairs: list[tuple[Run, Run]], n_boot: int) -> stats.Difference:
    """Validation loss A − B paired by seed, with the document bootstrap when every run has per-document
    losses over the same documents (else from the per-seed numbers alone, and the method says so)."""
    documents = [(_documents(ra), _documents(rb)) for ra, rb in pairs]
    usable = (
        all(da and db for da, db in documents)
        and len({tuple(d[0]["tokens"]) for d in documents} | {tuple(d[1]["tokens"]) for d in documents}) == 1
    )
    if usable:
        sums_a = np.array([da["nats"] for da, _ in documents])
        sums_b = np.array([db["nats"] for _, db in documents])
        weights = np.array(documents[0][0]["tokens"], dtype=np.float64)
        return stats.paired_difference(sums_a, sums_b, weights, n_boot=n_boot)
    difference = stats.paired_seed_difference(
        [ra.metric_values()[VAL_LOSS] for ra, _ in pairs], [rb.metric_values()[VAL_LOSS] for _, rb in pairs]
    )
    return _with_method(difference, difference.method + " (no per-document losses: seeds only)")


def _documents(run: Run) -> dict[str, Any] | None:
    entry = ((run.eval or {}).get("tasks") or {}).get(VALIDATION) or {}
    return entry.get("per_document")


def _with_method(difference: stats.Difference, method: str) -> stats.Difference:
    return replace(difference, method=method)


def example_scores(
    runs: list[Run], task: str, metric: str
) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """Per run name, its per-example ``metric`` over the examples every run scored (aligned by doc_id), and the
    chance score of each of those examples (1/choices; 0 for a generation task such as LAMBADA)."""
    scores: dict[str, dict[int, float]] = {}
    chance: dict[int, float] = {}
    for run in runs:
        found = {}
        for record in read_jsonl(run.directory / RUN_FILES["examples"]):
            if record.get("task") != task:
                continue
            value = record.get(metric)
            if not isinstance(value, (int, float)):  # bools count: JSON true/false are 1/0
                return None
            found[int(record["doc_id"])] = float(value)
            choices = len(record.get("loglikelihoods") or [])  # one for a generation task (LAMBADA): chance 0
            chance[int(record["doc_id"])] = 1.0 / choices if choices > 1 else 0.0
        if not found:
            return None
        scores[run.name] = found
    common = sorted(set.intersection(*(set(s) for s in scores.values()))) if scores else []
    if not common:
        return None
    return {name: np.array([s[d] for d in common]) for name, s in scores.items()}, np.array(
        [chance[d] for d in common]
    )


def benchmark_difference(
    pairs: list[tuple[Run, Run]], task: str, metric: str, n_boot: int
) -> tuple[stats.Difference, dict[str, Any]] | None:
    """A − B on one benchmark metric paired by seed with the examples resampled jointly, and the test of each
    interface against chance."""
    found = example_scores([run for pair in pairs for run in pair], task, metric)
    if found is None:
        return None
    scores, chance = found
    sums_a = np.stack([scores[ra.name] for ra, _ in pairs])
    sums_b = np.stack([scores[rb.name] for _, rb in pairs])
    difference = stats.paired_difference(sums_a, sums_b, n_boot=n_boot)
    against_chance = {
        side: stats.paired_difference(sums, chance, n_boot=n_boot, one_seed_interval=True)
        for side, sums in (("a", sums_a), ("b", sums_b))
    }
    info = {
        "examples": int(chance.size),
        "chance_level": float(chance.mean()),
        "a_vs_chance": against_chance["a"].as_dict(),
        "b_vs_chance": against_chance["b"].as_dict(),
        "at_chance": not any(d.excludes_zero for d in against_chance.values()),
    }
    return difference, info


def interface_pairs(interfaces: list[str], baselines: Iterable[str] = ()) -> list[tuple[str, str]]:
    """The pairs (A, B) that are compared, in report order: every pair, or with ``baselines`` only the pairs
    that hold one of them."""
    baselines = set(baselines)
    return [(a, b) for a, b in combinations(interfaces, 2) if not baselines or {a, b} & baselines]


def comparisons(
    runs: list[Run], interfaces: list[str], n_boot: int, point: str = "", baselines: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Every compared pair of interfaces (``interface_pairs``) on every question at one grid point: the paired
    difference, Holm's correction across the pairs, and the sentence."""
    out = []
    for question in questions(runs):
        family = []
        for a, b in interface_pairs(interfaces, baselines):
            pairs = paired_runs(runs, a, b)
            if not pairs:
                continue
            entry = _compare(pairs, question, a, b, n_boot)
            if entry is not None:
                family.append({"point": point, **entry})
        tested = [c for c in family if c["verdict"] != "at chance"]
        p_values = [c["p_value"] for c in tested]
        for c, adjusted, step in zip(tested, stats.holm(p_values), stats.holm_steps(p_values), strict=True):
            c["adjusted_p"], c["family"], c["holm_step"] = adjusted, len(tested), step or 1
        for c in family:
            c["detectable"] = _difference(c).detectable(c["family"], c.get("holm_step", 1))
            c["sentence"] = _sentence(c)
            c["verdict"] = _verdict(c)
        out += family
    return out


def few_seeds(comps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The few-seeds caveat, said once for the whole report: how many comparisons have too few seeds to be
    resolved, and the seeds that would resolve the largest of them (largest against its seed-to-seed spread),
    by ``stats.seeds_to_resolve`` from the observed standard deviation of the per-seed differences. None when
    every comparison has enough seeds."""
    few = [
        c
        for c in comps
        if c["verdict"] != "at chance" and 2 <= c["seeds"] < stats.MIN_SEEDS_TO_RESOLVE and c.get("seed_se")
    ]
    if not few:
        return None

    def seed_sd(c: dict[str, Any]) -> float:
        return c["seed_se"] * math.sqrt(c["seeds"])

    largest = max(few, key=lambda c: abs(c["estimate"]) / seed_sd(c))
    return {
        "seeds": sorted({c["seeds"] for c in few}),
        "comparisons": len(few),
        "largest": {key: largest[key] for key in ("point", "metric", "a", "b", "estimate", "unit", "family")},
        "seed_sd": seed_sd(largest),
        "seeds_needed": stats.seeds_to_resolve(largest["estimate"], seed_sd(largest), largest["family"]),
        "method": (
            f"a paired t test over seeds at {100 * stats.ALPHA:g}%"
            + (
                f"/{largest['family']} (Holm's first step over {largest['family']} pairs)"
                if largest["family"] > 1
                else ""
            )
            + f" with {100 * stats.POWER:g}% power, taking the standard deviation of the per-seed differences "
            f"observed over {largest['seeds']} seeds (itself an estimate on {largest['seeds'] - 1} degree"
            + ("s" if largest["seeds"] > 2 else "")
            + " of freedom) for the true one"
        ),
    }


def few_seeds_sentence(caveat: dict[str, Any], markdown: bool = True) -> str:
    """The caveat in words, for report.md (the seed count in bold) and the command line (``markdown=False``)."""
    largest = caveat["largest"]
    where = f"[{largest['point']}] " if largest["point"] else ""
    seeds = " or ".join(map(str, caveat["seeds"]))
    bold = "**" if markdown else ""
    needed = (
        f"about {bold}{caveat['seeds_needed']} seeds{bold}"
        if caveat["seeds_needed"]
        else "more than 1000 seeds"
    )
    return (
        f"With {seeds} seeds nothing is called resolved: the seed-to-seed variation rests on one degree of "
        f"freedom, so the {caveat['comparisons']} comparisons below give intervals without a verdict. The largest "
        f"effect against its seed-to-seed spread, {where}{largest['metric']} {largest['a']} − {largest['b']} = "
        f"{stats.fmt(largest['estimate'])} {largest['unit']} (per-seed differences' standard deviation "
        f"{stats.fmt(caveat['seed_sd'])}), would be resolved with {100 * stats.POWER:g}% probability with "
        f"{needed} (power calculation: {caveat['method']})."
    )


def _compare(
    pairs: list[tuple[Run, Run]], question: str, a: str, b: str, n_boot: int
) -> dict[str, Any] | None:
    task, _, metric = question.partition("/")
    pairs = [
        (ra, rb) for ra, rb in pairs if question in ra.metric_values() and question in rb.metric_values()
    ]
    if not pairs:
        return None
    tokens = np.mean(
        [run.summary.get("tokens_seen", 0) for pair in pairs for run in pair if run.summary] or [0]
    )
    scale = f"{human(tokens)} tokens each"
    extra: dict[str, Any] = {}
    if task == VALIDATION:
        difference = validation_difference(pairs, n_boot)
        unit = "nats/token"
        extra["transformations"] = _transformations(difference, pairs[0][0])
    else:
        found = benchmark_difference(pairs, task, metric, n_boot)
        if found is None:
            return None
        difference, extra["chance"] = found
        unit = metric
        scale += f"; {extra['chance']['examples']} examples"
    return {
        "metric": question,
        "a": a,
        "b": b,
        "higher_is_better": higher_is_better(question),
        "unit": unit,
        "scale": scale,
        **difference.as_dict(),
        "seed_list": [ra.seed for ra, _ in pairs],
        "adjusted_p": None,
        "family": 1,
        "verdict": "at chance" if extra.get("chance", {}).get("at_chance") else "tested",
        **extra,
    }


def _transformations(difference: stats.Difference, run: Run) -> dict[str, Any]:
    """The same comparison on perplexity (a ratio) and bits per byte (a fixed multiple on this split)."""
    entry = ((run.eval or {}).get("tasks") or {}).get(VALIDATION) or {}
    bounds = [difference.estimate, difference.low, difference.high]
    out: dict[str, Any] = {"ppl_ratio": [None if v is None else math.exp(v) for v in bounds]}
    if entry.get("tokens") and entry.get("bytes"):
        factor = entry["tokens"] / (entry["bytes"] * math.log(2))
        out["bits_per_byte"] = [None if v is None else v * factor for v in bounds]
    return out


def _difference(c: dict[str, Any]) -> stats.Difference:
    return stats.Difference(**{f.name: c[f.name] for f in fields(stats.Difference) if f.name in c})


def _sentence(c: dict[str, Any]) -> str:
    if c["verdict"] == "at chance":
        chance = c["chance"]
        return f"at chance ({chance['examples']} examples; chance level {stats.fmt(chance['chance_level'])})"
    return stats.decide(
        _difference(c),
        c["a"],
        c["b"],
        c["unit"],
        c["higher_is_better"],
        c["scale"],
        c["adjusted_p"],
        c["family"],
        step=c.get("holm_step", 1),
    )


def _verdict(c: dict[str, Any]) -> str:
    if c["verdict"] == "at chance":
        return "at chance"
    return "resolved" if c["sentence"].startswith("resolved") else "not resolved"


# ------------------------------------------------------------------------------------------------------------
# The unigram baseline


def unigram_baseline(runs: list[Run]) -> dict[str, Any] | None:
    """Cross-entropy of the validation tokens the runs were scored on (``coverage.scored_targets`` of their
    validation results; the whole split for results from before coverage was recorded) under a unigram model
    fit on the training split (add-½), and the runs whose evaluated validation loss has not beaten it."""
    data_dir = _data_dir(runs)
    if data_dir is None:
        return None
    scored = (validation_set(runs) or {}).get("coverage") or {}
    try:
        vocab = int(read_manifest(data_dir)["vocab_size"])
        train = sum(
            np.bincount(open_shard(p), minlength=vocab)[:vocab] for p in split_shards(data_dir, "train")
        )
        stream = np.concatenate([open_shard(p) for p in split_shards(data_dir, "val")])
    except (FileNotFoundError, ValueError, KeyError):
        return None  # the dataset moved or was removed since the sweep: no baseline line
    start, end = scored.get("scored_targets") or (0, len(stream))
    val = np.bincount(stream[start:end], minlength=vocab)[:vocab]
    value = stats.unigram_cross_entropy(train, val)
    flagged = [run.name for run in finished(runs) if run.metric_values().get(VAL_LOSS, -math.inf) >= value]
    return {
        "val_loss": value,
        "data_dir": str(data_dir),
        "train_tokens": int(train.sum()),
        "val_tokens": int(val.sum()),
        "scored_targets": [int(start), int(end)],
        "same_tokens_as_runs": "scored_targets" in scored,
        "not_beaten_by": flagged,
    }


def baseline_unavailable(runs: list[Run]) -> str:
    """Why ``unigram_baseline`` gave none: no run names its dataset, or the dataset cannot be read here."""
    data_dir = _data_dir(runs)
    if data_dir is None:
        return "no run's config.yaml names its dataset (data.dir), so there is no unigram baseline"
    return f"the prepared dataset {data_dir} could not be read here, so there is no unigram baseline"


def _data_dir(runs: list[Run]) -> Path | None:
    for run in runs:
        path = run.directory / RUN_FILES["config"]
        if path.exists():
            directory = (load_yaml(path).get("data") or {}).get("dir")
            if directory:
                return Path(directory)
    return None


def validation_set(runs: list[Run]) -> dict[str, Any] | None:
    """What the evaluation over the validation split covered: documents, tokens, windows, and ``coverage`` (what
    a limit left out; ``tablefree.evaluate.validation.coverage``)."""
    for run in finished(runs):
        entry = ((run.eval or {}).get("tasks") or {}).get(VALIDATION)
        if entry:
            documents = (entry.get("per_document") or {}).get("documents")
            return {
                "documents": documents,
                "tokens": entry.get("tokens"),
                "windows": entry.get("n"),
                "coverage": entry.get("coverage"),
            }
    return None


# ------------------------------------------------------------------------------------------------------------
# The gap against tokens seen (the trainer's in-training validation estimates)


def estimate_curve(run: Run) -> dict[float, float]:
    """tokens seen → the trainer's in-training validation estimate."""
    curve = {}
    for record in run.metrics_records():
        value = first_number(record, ESTIMATE_KEYS)
        if value is not None and isinstance(record.get("tokens"), (int, float)):
            curve[float(record["tokens"])] = value
    return curve


def gap_curves(
    runs: list[Run], interfaces: list[str], point: str = "", baselines: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Per compared pair: the paired difference A − B of the in-training validation estimate at each evaluation point,
    with its interval over seeds, and the slope of the gap against log tokens over the last doubling (``_trend``).
    Finished runs only: a run still training would cut every pair's curve to its own few first points."""
    out = []
    runs = [run for run in finished(runs) if curve_cut_short(run) is None]  # run_accounting names the others
    curves = {run.name: estimate_curve(run) for run in runs}
    for a, b in interface_pairs(interfaces, baselines):
        pairs = [(ra, rb) for ra, rb in _trained_pairs(runs, a, b) if curves[ra.name] and curves[rb.name]]
        if not pairs:
            continue
        common = sorted(set.intersection(*(set(curves[r.name]) for pair in pairs for r in pair)))
        if not common:
            continue
        gaps = np.array([[curves[ra.name][t] - curves[rb.name][t] for t in common] for ra, rb in pairs])
        points = []
        for column, tokens in enumerate(common):
            d = stats.paired_seed_difference(gaps[:, column], np.zeros(len(pairs)))
            points.append({"tokens": tokens, "estimate": d.estimate, "low": d.low, "high": d.high})
        out.append(
            {"point": point, "a": a, "b": b, "seeds": len(pairs), "curve": points, **_trend(common, gaps)}
        )
    return out


def _trained_pairs(runs: list[Run], a: str, b: str) -> list[tuple[Run, Run]]:
    by_key = {(run.interface, run.seed): run for run in runs}
    seeds = sorted({s for (i, s) in by_key if i == a} & {s for (i, s) in by_key if i == b})
    return [(by_key[(a, s)], by_key[(b, s)]) for s in seeds]


MIN_TREND_POINTS = 5  # a slope from fewer points (two, say) is a line through noise, not a trend


def _trend(tokens: list[float], gaps: np.ndarray) -> dict[str, Any]:
    """Slope of the gap per doubling of tokens over the last doubling of training (the points from the last
    one at or below half the final tokens to the end), and what it says; no trend, with the reason, from fewer
    than MIN_TREND_POINTS points or points spanning less than one doubling of tokens."""
    positive = [i for i, t in enumerate(tokens) if t > 0]
    below_half = [i for i in positive if tokens[i] <= tokens[-1] / 2]
    window = positive[positive.index(below_half[-1]) :] if below_half else positive
    span = tokens[window[-1]] / tokens[window[0]] if window else 1.0
    if len(window) < MIN_TREND_POINTS or span < 2:
        return {
            "trend": None,
            "no_trend": f"{len(positive)} in-training evaluation point{'s' if len(positive) != 1 else ''}"
            + (f" spanning ×{span:.2g} of tokens" if len(window) > 1 else "")
            + f"; a trend needs ≥ {MIN_TREND_POINTS} points over at least one doubling of tokens "
            "(more frequent `val_every`)",
        }
    fit = stats.slope_against_log([tokens[i] for i in window], gaps[:, window])
    per_doubling = {k: (v * math.log(2) if isinstance(v, float) else v) for k, v in fit.items()}
    final = float(gaps[:, -1].mean())
    if per_doubling["low"] is None:
        reading = "no interval (one seed)"
    elif per_doubling["low"] > 0 or per_doubling["high"] < 0:
        reading = "shrinking" if (per_doubling["slope"] < 0) == (final > 0) else "growing"
    else:
        reading = "no resolved trend"
    return {
        "trend": {
            "slope_per_doubling": per_doubling["slope"],
            "low": per_doubling["low"],
            "high": per_doubling["high"],
            "points": per_doubling["points"],
            "from_tokens": tokens[window[0]],
            "final_gap": final,
            "reading": reading,
        }
    }


# ------------------------------------------------------------------------------------------------------------
# The grid


def grid_summary(
    runs: list[Run], points: list[str], interfaces: list[str], comps: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per grid point: tokens, trainable parameters and mean evaluated validation loss per interface, and the
    validation-loss gap of each pair."""
    rows = []
    for point in points:
        here = [run for run in finished(runs) if run.point == point]
        if not here:
            continue
        cells = {}
        for interface in interfaces:
            mine = [run for run in here if run.interface == interface and VAL_LOSS in run.metric_values()]
            if not mine:
                continue
            cells[interface] = {
                "val_loss": float(np.mean([run.metric_values()[VAL_LOSS] for run in mine])),
                "tokens": float(np.mean([(run.summary or {}).get("tokens_seen", 0) for run in mine])),
                "params": ((mine[0].summary or {}).get("params") or {}).get("total_trainable"),
                "seeds": len(mine),
            }
        gaps = [
            {k: c[k] for k in ("a", "b", "estimate", "low", "high", "verdict")}
            for c in comps
            if c["point"] == point and c["metric"] == VAL_LOSS
        ]
        rows.append({"point": point, "interfaces": cells, "gaps": gaps})
    return rows
