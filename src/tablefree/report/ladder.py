"""A ladder of model sizes: the same question asked of several bodies ("rungs"), each its own budget sweep, at
matched tokens per parameter. The rungs' reports are the inputs (``report.json`` for the body, ``report_data.json``
for the runs); ``ladder_data`` keeps what the ladder uses of them in one sidecar, and ``ladder_report`` recomputes
everything from that sidecar alone.

Per rung and tokens-per-parameter ratio: each pair's gap (learned − other, paired by seed, the report's interval),
in nats/token and bits per byte, the token ratio (``scaling.token_ratio`` over the rung's ladder budgets), the
table's share of the learned model and the compute 6·N·D (N the parameters outside the table: the table is a
lookup). Across rungs at one ratio: the change of each gap from one rung to the next, and with three rungs or more
the least-squares slope of the gap against log₂(layers) and against log₂(compute). The rungs are separate runs
with their own seeds, scored on the same validation documents: each change and slope is a contrast of the rungs'
paired gaps (``stats.contrast_difference``: seeds unpaired across rungs, documents shared). Per rung and ratio
also where in the vocabulary each gap lives: split by the training-split frequency band of the input and of the
target token (``analysis.frequency_bands.band_split``), where the rung's runs were scored with those tallies.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tablefree import stats
from tablefree.analysis.frequency_bands import NO_TALLIES_WHY, band_split, run_tallies
from tablefree.evaluate.frequency_bands import SIDES
from tablefree.fileio import read_json, strict_json, write_json_atomic, write_text_atomic
from tablefree.report import comparison
from tablefree.report.data import DATA_FILE, runs_from_data
from tablefree.report.figures import _save_figure
from tablefree.scaling.observations import RATIO_TOLERANCE, Observation
from tablefree.scaling.token_ratio import token_ratio

FORMAT = "tablefree-ladder-data/1"
REFERENCE = "learned"
DEFAULT_RATIOS = (7.5, 15.0, 30.0)
MIN_RUNGS_FOR_TREND = 3  # a slope through two rungs is their difference: say so, do not call it a trend
OWN_RATES = "own"  # ladder_data's rate: each interface at the rate its rung's rate check chose


def ladder_data(
    rung_dirs: Sequence[str | Path],
    ratios: Sequence[float] = DEFAULT_RATIOS,
    rate: float | str | None = None,
    rate_checks: Sequence[str | Path] = (),
    interfaces: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ladder's raw data from each rung's report directory (``report.json`` + ``report_data.json``, as
    ``tablefree report`` writes them): per rung its body and, per ratio, the finished runs of the budget at that
    many tokens per parameter of its learned model (within 5%), without their training curves. Refuses a rung
    without such a budget, naming the ratios it has. A rung whose grid also has rates trains several points at a
    ratio: ``rate`` picks the peak rate every rung is compared at (refused without it, naming the rates), or
    ``"own"`` compares each interface at its own rate: the one its rung's rate check chose on the selection split
    at the rung's largest budget (a rung without a rate check: its one rate, marked unchecked). ``rate_checks``
    are report directories of rate checks swept apart from their rung (its body, its largest budget, seed 0
    say): each is used for the rung of the same body, whose own report has no check; one that matches no rung,
    or another budget, is refused. ``interfaces`` keeps only those interfaces' runs (the learned reference among
    them), e.g. the ones a rate check rated."""
    if len(rung_dirs) < 2:
        raise ValueError(f"a ladder needs at least two rungs (report directories), got {len(rung_dirs)}")
    if isinstance(rate, str) and rate != OWN_RATES:
        raise ValueError(f"rate: expected a number or {OWN_RATES!r}, got {rate!r}")
    if interfaces is not None and REFERENCE not in interfaces:
        raise ValueError(
            f"interfaces: the ladder's gaps are against {REFERENCE}, so it must be among {list(interfaces)}"
        )
    if rate_checks and rate != OWN_RATES:
        raise ValueError(
            f"rate checks are read only to compare each interface at its own rate (rate {OWN_RATES!r})"
        )
    external = {str(Path(d)): _read_check(Path(d)) for d in rate_checks}
    used: set[str] = set()
    rungs = []
    for directory in map(Path, rung_dirs):
        report = read_json(directory / "report.json")
        data_path = directory / DATA_FILE
        data = read_json(data_path)
        model = _model_of(report)
        if "n_layers" not in model:
            raise ValueError(f"{directory / 'report.json'}: config.train.model names no n_layers")
        records = [r for r in data.get("runs") or [] if r.get("state") == "done"]
        if interfaces is not None:
            records = [r for r in records if r["interface"] in interfaces]
        learned = [r for r in records if r["interface"] == REFERENCE]
        if not learned:
            raise ValueError(
                f"{data_path}: no finished {REFERENCE} runs: the ratios are per learned parameter"
            )
        learned_params = learned[0]["params"]["learned_total"]
        by_point: dict[str, list[dict]] = {}
        for record in records:
            by_point.setdefault(record["point"], []).append(record)
        have = {p: tokens / learned_params for p, tokens in _point_budgets(records).items()}
        rates = _point_rates(report.get("config") or {})
        own = None
        if rate == OWN_RATES:
            check = _check_for(model, report, external, directory, used)
            own = _own_rates(report, by_point, directory, check)
        points: dict[str, str | dict[str, str]] = {}
        for ratio in ratios:
            match = [p for p, r in have.items() if abs(r / ratio - 1) <= RATIO_TOLERANCE]
            if own is not None:
                points[f"{ratio:g}"] = _own_points(own["rates"], match, rates, by_point, data_path, ratio)
                continue
            if isinstance(rate, float | int):
                match = [p for p in match if rates.get(p) is not None and math.isclose(rates[p], rate)]
            if not match:
                found = ", ".join(
                    f"{p}: {r:.2f} at lr {rates.get(p)}" for p, r in sorted(have.items(), key=lambda x: x[1])
                )
                at = "" if rate is None else f" at peak rate {rate:g}"
                raise ValueError(
                    f"{data_path}: no finished budget at {ratio:g} tokens per learned parameter (within "
                    f"{RATIO_TOLERANCE:.0%}){at}; its points have {found}"
                )
            if len(match) > 1:
                raise ValueError(
                    f"{data_path}: {len(match)} points at {ratio:g} tokens per learned parameter ("
                    f"{', '.join(f'{p} at lr {rates.get(p)}' for p in match)}); name the rate (--rate)"
                )
            points[f"{ratio:g}"] = match[0]
        for ratio_name, point in points.items():
            _refuse_single_seeds(_point_runs(point, by_point), data_path, ratio_name, _rates_of(point, rates))
        rungs.append(
            {
                "name": f"{model['n_layers']} layers",
                "source": str(directory),
                "source_sha256": hashlib.sha256(data_path.read_bytes()).hexdigest(),
                "sweep": report.get("name"),
                "model": model,
                "learned_params": learned_params,
                "table_params": learned[0]["params"]["input_interface"],
                "points": points,
                "rates": {ratio: _rates_of(point, rates) for ratio, point in points.items()},
                "rate_choice": own,
                "runs": [
                    {k: v for k, v in r.items() if k != "curve"}
                    for point in points.values()
                    for r in _point_runs(point, by_point)
                ],
            }
        )
    if interfaces is not None:
        found = {r["interface"] for rung in rungs for r in rung["runs"]}
        absent = [i for i in interfaces if i not in found]
        if absent:
            raise ValueError(f"interfaces: no rung trained {', '.join(absent)}")
    unused = [d for d in external if d not in used]
    if unused:
        raise ValueError(
            f"rate check {unused[0]}: its body matches no rung ({', '.join(map(str, rung_dirs))})"
        )
    rungs.sort(key=lambda r: r["model"]["n_layers"])
    return {"format": FORMAT, "ratios": [float(r) for r in ratios], "rate": rate, "rungs": rungs}


def _rate_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A sweep report's rate checks (``statistics.learning_rate``), one per budget; none without a rate grid."""
    return ((report.get("statistics") or {}).get("learning_rate")) or []


def _model_of(report: dict[str, Any]) -> dict[str, Any]:
    return ((report.get("config") or {}).get("train") or {}).get("model") or {}


def _point_budgets(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Each grid point's budget: the most tokens any of its finished runs saw."""
    budgets: dict[str, int] = {}
    for record in records:
        budgets[record["point"]] = max(budgets.get(record["point"], 0), record["tokens_seen"])
    return budgets


def _read_check(directory: Path) -> dict[str, Any]:
    """A rate check's report directory: its body, its checks and each of its points' budget in tokens."""
    report = read_json(directory / "report.json")
    data = read_json(directory / DATA_FILE)
    checks = _rate_checks(report)
    if not checks:
        raise ValueError(f"{directory / 'report.json'}: no rate check (statistics.learning_rate is empty)")
    budgets = _point_budgets(r for r in data.get("runs") or [] if r.get("state") == "done")
    return {"source": str(directory), "model": _model_of(report), "checks": checks, "budgets": budgets}


def _check_for(
    model: dict[str, Any], report: dict[str, Any], external: dict[str, dict], directory: Path, used: set[str]
) -> dict[str, Any] | None:
    """The rate check swept apart for this rung's body, if one was given (refused beside the rung's own)."""
    matches = [key for key, check in external.items() if check["model"] == model]
    if not matches:
        return None
    if len(matches) > 1:
        raise ValueError(f"rate checks {', '.join(matches)} are both for the body of {directory}")
    if _rate_checks(report):
        raise ValueError(
            f"{directory / 'report.json'} has its own rate check; rate check {matches[0]} is not used"
        )
    used.add(matches[0])
    return external[matches[0]]


def _own_rates(
    report: dict[str, Any],
    by_point: dict[str, list[dict]],
    directory: Path,
    external: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Each interface's rate as the rung's rate check chose it at its largest budget (``report.json``,
    statistics.learning_rate, or ``external``: a check swept apart at that budget), with what it was chosen
    among, on how many seeds and on which split; a rung without a rate check: its one rate, unchecked. An
    interface the rung trained but the check did not rate is refused."""
    trained = list(dict.fromkeys(r["interface"] for runs in by_point.values() for r in runs))
    checks = _rate_checks(report)
    source = directory / "report.json"
    budgets = _point_budgets(r for runs in by_point.values() for r in runs)
    if external is not None:
        checks, source = external["checks"], Path(external["source"]) / "report.json"
        check_budgets = external["budgets"]
    else:
        check_budgets = budgets
    if not checks:
        rates = {_point_rates(report.get("config") or {}).get(p) for p in by_point}
        if len(rates) != 1 or None in rates:
            raise ValueError(f"{directory / 'report.json'}: no rate check, and its points have rates {rates}")
        rate = rates.pop()
        return {
            "checked": False,
            "rates": dict.fromkeys(trained, rate),
            "per_interface": {i: {"chosen": rate, "among": [rate], "seeds": None} for i in trained},
        }

    def budget(check: dict[str, Any]) -> int:
        return max((check_budgets.get(p, 0) for p in check["points"]), default=0)

    largest = max(checks, key=budget)
    if external is not None and abs(budget(largest) / max(budgets.values()) - 1) > RATIO_TOLERANCE:
        raise ValueError(
            f"{source}: its rate check trained {budget(largest):,} tokens, the rung {directory} "
            f"{max(budgets.values()):,} at its largest budget: a rung's rate is checked at its largest budget"
        )
    missing = [i for i in trained if i not in largest["per_interface"]]
    if missing:
        raise ValueError(
            f"{source}: the rate check at the largest budget (points "
            f"{', '.join(largest['points'])}) rated {', '.join(largest['per_interface'])}, not {', '.join(missing)}"
        )
    selection = largest.get("selection") or {}
    return {
        "checked": True,
        "source": str(source.parent),
        "rates": {i: cell["chosen"] for i, cell in largest["per_interface"].items() if i in trained},
        "points": largest["points"],
        "selection": selection.get("name", "unknown"),
        "selection_too_small": selection.get("too_small"),
        "per_interface": {
            i: {
                "chosen": cell["chosen"],
                "among": sorted(float(rate) for rate in cell["rates"]),
                "seeds": cell["seeds"],
                "at_edge": cell["at_edge"],
            }
            for i, cell in largest["per_interface"].items()
            if i in trained
        },
    }


def _own_points(
    own: dict[str, float],
    match: list[str],
    rates: dict[str, float | None],
    by_point: dict[str, list[dict]],
    data_path: Path,
    ratio: float,
) -> dict[str, str]:
    """interface -> the point at ``ratio`` where it trained at its own rate."""
    chosen = {}
    for interface, wanted in own.items():
        at = [
            p
            for p in match
            if rates.get(p) is not None
            and math.isclose(rates[p], wanted)
            and any(r["interface"] == interface for r in by_point[p])
        ]
        if len(at) != 1:
            raise ValueError(
                f"{data_path}: {interface}'s own rate {wanted:g} (its rate check's choice) has {len(at)} finished "
                f"points at {ratio:g} tokens per learned parameter (expected one; points there: "
                f"{', '.join(match) or 'none'})"
            )
        chosen[interface] = at[0]
    tokens = {i: max(r["tokens_seen"] for r in by_point[p] if r["interface"] == i) for i, p in chosen.items()}
    if len(set(tokens.values())) > 1:
        raise ValueError(
            f"{data_path}: at {ratio:g} tokens per learned parameter the interfaces' own points trained different "
            f"budgets ({', '.join(f'{i} {n:,} at {chosen[i]}' for i, n in tokens.items())}): a gap compares one budget"
        )
    return chosen


def _refuse_single_seeds(runs: list[dict], data_path: Path, ratio: str, rate: Any) -> None:
    """A rung's gap varies by seed, so each interface it compares needs two seeds or more at every ratio."""
    seeds: dict[str, set[int]] = {}
    for run in runs:
        seeds.setdefault(run["interface"], set()).add(run["seed"])
    thin = {interface: len(s) for interface, s in seeds.items() if len(s) < 2}
    if thin:
        raise ValueError(
            f"{data_path}: at {ratio} tokens per learned parameter (lr {_fmt_rate(rate)}) "
            f"{', '.join(f'{i} has {n} seed' for i, n in thin.items())}: a rung's gap needs 2 seeds or more of "
            "each interface (train more seeds there, or compare at another rate)"
        )


def _rates_of(point: str | dict[str, str], rates: dict[str, float | None]) -> float | dict[str, float] | None:
    return {i: rates[p] for i, p in point.items()} if isinstance(point, dict) else rates.get(point)


def _point_runs(point: str | dict[str, str], by_point: dict[str, list[dict]]) -> list[dict]:
    """The runs a ratio compares: a point's, or each interface's at its own point."""
    if isinstance(point, dict):
        return [r for interface, p in point.items() for r in by_point[p] if r["interface"] == interface]
    return by_point[point]


def _point_rates(config: dict[str, Any]) -> dict[str, float | None]:
    """Each grid point's peak rate: its own where the grid sets one, else the recipe's."""
    recipe = ((config.get("train") or {}).get("optim") or {}).get("lr")
    return {
        point["name"]: ((point.get("train") or {}).get("optim") or {}).get("lr", recipe)
        for point in config.get("grid_points") or []
    }


def ladder_report(data: dict[str, Any], n_boot: int = stats.DEFAULT_BOOTSTRAP) -> dict[str, Any]:
    """Everything the ladder says, from ``ladder_data``'s dict alone (module docstring)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"ladder data: expected format {FORMAT!r}, got {data.get('format')!r}")
    ratios = [f"{r:g}" for r in data["ratios"]]
    rungs = data["rungs"]
    interfaces = [i for i in _interfaces(rungs) if i != REFERENCE]
    result: dict[str, Any] = {
        "reference": REFERENCE,
        "interfaces": interfaces,
        "ratios": data["ratios"],
        "bootstrap": n_boot,
        "interval": (
            "95%, the wider of the seed t and the seed-and-document t (stats.paired_difference); changes and "
            "slopes across rungs: stats.contrast_difference (seeds unpaired across rungs, documents shared)"
        ),
        "rungs": [],
        "across": [],
    }
    gaps: dict[
        tuple[str, str, str], np.ndarray
    ] = {}  # (rung, ratio, code) -> (seeds, documents) summed A − B
    weights: np.ndarray | None = None
    for rung in rungs:
        runs = runs_from_data(
            {"format": "tablefree-report-data/1", "runs": [{**r, "curve": []} for r in rung["runs"]]}
        )
        entry = {
            key: rung[key]
            for key in ("name", "source", "source_sha256", "sweep", "model", "learned_params", "rates")
        }
        entry["rate_choice"] = rung.get("rate_choice")
        entry["table_share"] = rung["table_params"] / rung["learned_params"]
        entry["non_table_params"] = rung["learned_params"] - rung["table_params"]
        entry["ratios"] = []
        observations = []
        for ratio in ratios:
            point = rung["points"][ratio]
            wanted = point if isinstance(point, dict) else None
            here = [run for run in runs if run.point == (wanted or {}).get(run.interface, point)]
            tokens = max(run.summary["tokens_seen"] for run in here)
            row: dict[str, Any] = {
                "ratio": float(ratio),
                "point": point,
                "tokens": tokens,
                "tokens_per_param": tokens / rung["learned_params"],
                "compute": 6.0 * entry["non_table_params"] * tokens,
                "loss": {},
                "gaps": {},
            }
            for interface in [REFERENCE, *interfaces]:
                values = [
                    run.metric_values()[comparison.VAL_LOSS] for run in here if run.interface == interface
                ]
                mean, std = stats.mean_std(values) if values else (None, None)
                row["loss"][interface] = {"mean": mean, "std": std, "seeds": len(values)}
            for code in interfaces:
                pairs = comparison.paired_runs(here, REFERENCE, code)
                if not pairs:
                    continue
                difference = comparison.validation_difference(pairs, n_boot)
                documents = [(_validation(a), _validation(b)) for a, b in pairs]
                per_token = documents[0][0]["tokens"] / documents[0][0]["bytes"] / math.log(2)
                row["gaps"][code] = {**difference.as_dict(), "bits_per_byte": _scaled(difference, per_token)}
                gaps[(rung["name"], ratio, code)] = np.array(
                    [np.subtract(a["per_document"]["nats"], b["per_document"]["nats"]) for a, b in documents]
                )
                doc_tokens = np.asarray(documents[0][0]["per_document"]["tokens"], dtype=np.float64)
                if weights is not None and not np.array_equal(weights, doc_tokens):
                    raise ValueError(
                        f"{rung['source']}: its validation documents differ from the first rung's; a ladder "
                        "compares rungs on one validation set"
                    )
                weights = doc_tokens
            row["frequency_bands"] = _bands(here, interfaces, n_boot)
            observations += [
                Observation(run.interface, run.seed, float(tokens), run.metric_values()[comparison.VAL_LOSS])
                for run in here
            ]
            entry["ratios"].append(row)
        entry["token_ratio"] = token_ratio(observations)
        result["rungs"].append(entry)
    if weights is None:
        raise ValueError(f"no rung has paired {REFERENCE} and other runs to compare")
    for ratio in ratios:
        for code in interfaces:
            present = [r for r in result["rungs"] if (r["name"], ratio, code) in gaps]
            if len(present) < 2:
                continue
            groups = [gaps[(r["name"], ratio, code)] for r in present]
            steps = [
                {
                    "from": a["name"],
                    "to": b["name"],
                    **stats.contrast_difference([ga, gb], weights, [-1.0, 1.0], n_boot).as_dict(),
                }
                for (a, ga), (b, gb) in zip(
                    zip(present, groups, strict=True), zip(present[1:], groups[1:], strict=True), strict=False
                )
            ]
            for step, p in zip(steps, stats.holm([s["p_value"] for s in steps]), strict=True):
                step["holm_p"] = p
            entry = {
                "ratio": float(ratio),
                "code": code,
                "rungs": [r["name"] for r in present],
                "steps": steps,
            }
            if len(present) >= MIN_RUNGS_FOR_TREND:
                layers = [math.log2(r["model"]["n_layers"]) for r in present]
                compute = [math.log2(_row(r, ratio)["compute"]) for r in present]
                entry["per_doubling_of_layers"] = stats.contrast_difference(
                    groups, weights, stats.least_squares_weights(layers), n_boot
                ).as_dict()
                entry["per_doubling_of_compute"] = stats.contrast_difference(
                    groups, weights, stats.least_squares_weights(compute), n_boot
                ).as_dict()
            else:
                entry["trend_refused"] = (
                    f"{len(present)} rungs: a slope needs {MIN_RUNGS_FOR_TREND} (through two it is their step)"
                )
            result["across"].append(entry)
    result["sentences"] = _sentences(result, data.get("rate"))
    # the question asked first: the reference against the first code at the largest ratio (the papers' regime)
    primary = next((e for e in result["across"] if e["ratio"] == max(data["ratios"])), None)
    result["answer"] = None if primary is None else result["sentences"][result["across"].index(primary)]
    return strict_json(result)


def _bands(here: list[Any], codes: list[str], n_boot: int) -> dict[str, Any]:
    """The row's gaps split by frequency band, or why there is no split."""
    tallies, missing = run_tallies(here)
    if missing:
        return {
            "unavailable": f"{len(missing)} of its {len(here)} runs have no frequency-band tallies "
            f"({NO_TALLIES_WHY}): re-run the rung's compare command, which evaluates them again, then its "
            "report and the ladder"
        }
    try:
        return band_split(tallies, [(REFERENCE, code) for code in codes], n_boot)
    except ValueError as error:
        return {"unavailable": str(error)}


def _interfaces(rungs: list[dict]) -> list[str]:
    """Every interface trained on any rung, in the order the rungs list them."""
    return list(dict.fromkeys(r["interface"] for rung in rungs for r in rung["runs"]))


def _validation(run: Any) -> dict[str, Any]:
    return run.eval["tasks"][comparison.VALIDATION]


def _row(rung: dict[str, Any], ratio: str) -> dict[str, Any]:
    return next(row for row in rung["ratios"] if f"{row['ratio']:g}" == ratio)


def _scaled(difference: stats.Difference, factor: float) -> dict[str, float | None]:
    """The gap in another unit that is a fixed multiple of nats/token on the same split (bits per byte)."""
    values = {"estimate": difference.estimate, "low": difference.low, "high": difference.high}
    return {key: None if value is None else value * factor for key, value in values.items()}


def _reading(d: dict[str, Any]) -> str:
    """How a change of a gap (learned − code: negative = learned ahead) reads, only where its interval says so."""
    if not d.get("excludes_zero"):
        return "does not change measurably (the interval includes 0)"
    return "shrinks (resolved)" if d["estimate"] > 0 else "grows (resolved)"


def _sentences(result: dict[str, Any], rate: float | str | None) -> list[str]:
    out = []
    unchecked = [
        r["name"] for r in result["rungs"] if r.get("rate_choice") and not r["rate_choice"]["checked"]
    ]
    if rate == OWN_RATES:
        tail = " Each interface at its own rate" + (
            f"; not checked on {', '.join(unchecked)} (its one rate)." if unchecked else "."
        )
    else:
        tail = "" if rate is None else f" Every rung at peak rate {rate:g}."
    for entry in result["across"]:
        code, ratio = entry["code"], f"{entry['ratio']:g}"
        gaps = "; ".join(
            f"{r['name']} {_fmt_gap(_row(r, ratio)['gaps'][code])}"
            for r in result["rungs"]
            if code in _row(r, ratio)["gaps"]
        )
        head = f"At {ratio} tokens per parameter, {REFERENCE} − {code} (nats/token): {gaps}."
        if "per_doubling_of_layers" in entry:
            slope = entry["per_doubling_of_layers"]
            head += (
                f" Per doubling of depth the gap changes by {_fmt_gap(slope)} over {len(entry['rungs'])} rungs: "
                f"the {REFERENCE} table's lead {_reading(slope)}."
            )
        else:
            step = entry["steps"][0]
            head += (
                f" From {step['from']} to {step['to']} it changes by {_fmt_gap(step)}: the lead "
                f"{_reading(step)}; {entry['trend_refused']}."
            )
        out.append(head + tail)
    return out


def _fmt_gap(d: dict[str, Any]) -> str:
    if d.get("estimate") is None:  # a frequency band without validation tokens
        return "–"
    if d.get("low") is None:
        return f"{d['estimate']:+.3f} (no interval)"
    return f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def render_markdown(report: dict[str, Any]) -> str:
    """The ladder's ``report.md``: the answer, one table per ratio, the changes across rungs, the method."""
    codes = report["interfaces"]
    lines = [f"# The ladder: {', '.join(r['name'] for r in report['rungs'])}", "", "## The answer", ""]
    lines += [f"**{report['answer']}**" if report["answer"] else "No pair was measured on two rungs.", ""]
    lines += ["Every ratio and pair:", ""]
    lines += [f"- {s}" for s in report["sentences"]]
    lines += ["", "## Per rung", "", *_rate_lines(report)]
    for ratio in (f"{r:g}" for r in report["ratios"]):
        lines += [f"### {ratio} tokens per parameter of the learned model", ""]
        header = [
            "rung",
            "learned params",
            "table share",
            "peak rate",
            "tokens",
            "tokens/param",
            "compute 6·N·D",
            "learned loss",
        ]
        header += [f"{c} loss" for c in codes]
        header += [f"{REFERENCE} − {c} (nats/token)" for c in codes]
        header += [f"{REFERENCE} − {c} (bits/byte)" for c in codes]
        header += [f"token ratio {c}" for c in codes]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for rung in report["rungs"]:
            row = _row(rung, ratio)
            cells = [
                rung["name"],
                f"{rung['learned_params']:,}",
                f"{rung['table_share']:.1%}",
                _fmt_rate(rung["rates"].get(ratio)),
                f"{row['tokens'] / 1e6:.2f}M",
                f"{row['tokens_per_param']:.2f}",
                f"{row['compute']:.3g}",
            ]
            cells += [_fmt_loss(row["loss"][i]) for i in [REFERENCE, *codes]]
            cells += [_fmt_gap(row["gaps"][c]) if c in row["gaps"] else "–" for c in codes]
            cells += [_fmt_gap(row["gaps"][c]["bits_per_byte"]) if c in row["gaps"] else "–" for c in codes]
            cells += [_fmt_ratio(rung, c, row["tokens"]) for c in codes]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Across rungs", ""]
    lines += [
        "| tokens/param | pair | change between rungs (Holm over the steps) | per doubling of layers | "
        "per doubling of compute |",
        "|---|---|---|---|---|",
    ]
    for entry in report["across"]:
        steps = "; ".join(
            f"{s['from']} → {s['to']}: {_fmt_gap(s)} (Holm p {stats.fmt_p(s['holm_p'])})"
            for s in entry["steps"]
        )
        slope = entry.get("per_doubling_of_layers")
        compute = entry.get("per_doubling_of_compute")
        refused = entry.get("trend_refused", "")
        lines.append(
            f"| {entry['ratio']:g} | {REFERENCE} − {entry['code']} | {steps} | "
            f"{_fmt_gap(slope) if slope else refused} | {_fmt_gap(compute) if compute else refused} |"
        )
    lines += [
        "",
        *_band_lines(report),
        "## Method",
        "",
        f"Intervals: {report['interval']}; {report['bootstrap']} bootstrap replicates. A gap is {REFERENCE} − "
        "code in validation nats per token (negative: the learned table ahead); bits per byte are the same gap "
        "times the validation split's tokens per byte / ln 2 (one vocabulary across the ladder). A change between "
        "rungs is positive where the learned lead shrinks. Compute is 6·N·D with N the parameters outside the "
        "table (the same N for every interface of a rung; the table is a lookup). The token ratio is "
        "`scaling.token_ratio` on the rung's ladder budgets only (docs/experiments.md): below 1 the learned model "
        "needs fewer tokens for the code's loss.",
        "",
        "Sources (each rung's `report_data.json`, by sha256):",
        "",
    ]
    lines += [
        f"- {r['name']}: `{r['source']}` ({r['sweep']}), sha256 {r['source_sha256'][:16]}…"
        for r in report["rungs"]
    ]
    return "\n".join(lines) + "\n"


def _band_lines(report: dict[str, Any]) -> list[str]:
    """Each rung's gaps per frequency band: one row per ratio, side and pair."""
    rows, unavailable = [], []
    definitions = []
    for rung in report["rungs"]:
        for row in rung["ratios"]:
            split = row.get("frequency_bands") or {}
            if "unavailable" in split:
                unavailable.append(
                    f"- {rung['name']}, {row['ratio']:g} tokens/param: {split['unavailable']}."
                )
                continue
            if "sides" not in split:
                continue
            definitions.append(split["definition"])
            for side in SIDES:
                for pair in split["sides"][side]["pairs"]:
                    cells = [rung["name"], f"{row['ratio']:g}", side, f"{pair['a']} − {pair['b']}"]
                    cells += [_fmt_gap(cell) for cell in pair["bands"]] + [_fmt_gap(pair["whole"])]
                    rows.append("| " + " | ".join(cells) + " |")
    if not rows and not unavailable:
        return []
    lines = ["## Where the gap lives in the vocabulary", ""]
    if rows:
        bands = max(d["bands"] for d in definitions)
        schemes = sorted({d["scheme"] for d in definitions})
        lines += [
            "Each gap split by the training-split frequency band of the input token (what the interface is fed) "
            f"and of the target token: {bands} bands ({'; '.join(schemes)}), band 0 the most frequent types. A "
            "band's gap is on its own tokens, paired by seed, with the report's interval (95%, not corrected for "
            "the number of bands); each rung's report gives the shares, losses and contributions.",
            "",
        ]
        header = ["rung", "tokens/param", "side", "pair", *(f"band {b}" for b in range(bands)), "whole gap"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows, ""]
    if unavailable:
        lines += ["No split:", "", *unavailable, ""]
    return lines


def _fmt_rate(rate: float | dict[str, float] | None) -> str:
    if isinstance(rate, dict):
        return ", ".join(f"{interface} {value:g}" for interface, value in rate.items())
    return "–" if rate is None else f"{rate:g}"


def _rate_lines(report: dict[str, Any]) -> list[str]:
    """How each rung's rates were chosen, where the ladder compares each interface at its own."""
    lines = []
    for rung in report["rungs"]:
        choice = rung.get("rate_choice")
        if not choice:
            continue
        if not choice["checked"]:
            lines.append(
                f"- {rung['name']}: {_fmt_rate(choice['rates'])}, its only rate: no rate check in its report"
            )
            continue
        cells = []
        for interface, cell in choice["per_interface"].items():
            among = cell["among"]
            if len(among) == 1:
                cells.append(f"{interface} {cell['chosen']:g} (its only rate: not chosen)")
                continue
            edge = ", at the grid's edge" if cell["at_edge"] else ""
            cells.append(
                f"{interface} {cell['chosen']:g} of {{{', '.join(f'{r:g}' for r in among)}}} on "
                f"{cell['seeds']} seed{'s' if cell['seeds'] != 1 else ''}{edge}"
            )
        small = f" ({choice['selection_too_small']})" if choice.get("selection_too_small") else ""
        apart = (
            ""
            if choice.get("source", rung["source"]) == rung["source"]
            else f" of the rate check `{choice.get('source')}`"
        )
        lines.append(
            f"- {rung['name']}: {'; '.join(cells)}; chosen on the {choice['selection']}{small} at the rung's "
            f"largest budget (points {', '.join(choice['points'])}{apart}), used at every ratio"
        )
    return ["Rates (each interface at its own):", "", *lines, ""] if lines else []


def _fmt_loss(cell: dict[str, Any]) -> str:
    if cell["mean"] is None:
        return "–"
    std = "" if cell["std"] is None else f" ± {cell['std']:.4f}"
    return f"{cell['mean']:.4f}{std}"


def _fmt_ratio(rung: dict[str, Any], code: str, tokens: float) -> str:
    entry = next((c for c in rung["token_ratio"]["codes"] if c["code"] == code), None)
    row = next((b for b in (entry or {}).get("budgets", []) if b["tokens"] == tokens), None)
    if row is None:
        return "–"
    if row["estimate"] is None:
        return "–" if row.get("bound") is None else f"{row['bound']} {row['bound_value']:.3f}"
    if row["low"] is None:
        return f"{row['estimate']:.3f}"
    return f"{row['estimate']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def draw_ladder(report: dict[str, Any], path: Path) -> None:
    """Each gap against layers (left) and against compute (right), one line per ratio, 95% interval bars."""
    # matplotlib is imported where a figure is drawn: it is heavy, and only the verbs that draw need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    codes = list(dict.fromkeys(entry["code"] for entry in report["across"]))  # measured on two rungs or more
    if not codes:
        return
    figure, axes = plt.subplots(len(codes), 2, figsize=(11, 3.8 * len(codes)), squeeze=False)
    markers = ["o", "s", "^", "D", "v"]
    for row_axes, code in zip(axes, codes, strict=True):
        for marker, ratio in zip(markers * 3, (f"{r:g}" for r in report["ratios"]), strict=False):
            points = [(r, _row(r, ratio)) for r in report["rungs"] if code in _row(r, ratio)["gaps"]]
            for ax, x in (
                (row_axes[0], [r["model"]["n_layers"] for r, _ in points]),
                (row_axes[1], [row["compute"] for _, row in points]),
            ):
                y = [row["gaps"][code]["estimate"] for _, row in points]
                low = [row["gaps"][code]["low"] for _, row in points]
                high = [row["gaps"][code]["high"] for _, row in points]
                yerr = None if None in low else [np.subtract(y, low), np.subtract(high, y)]
                ax.errorbar(x, y, yerr=yerr, marker=marker, capsize=3, label=f"{ratio} tokens/param")
        for ax, label in ((row_axes[0], "layers"), (row_axes[1], "compute 6·N·D (FLOP)")):
            ax.set_xscale("log", base=2 if label == "layers" else 10)
            ax.axhline(0.0, color="grey", linewidth=0.8)
            ax.set_xlabel(label)
            ax.set_ylabel(f"{REFERENCE} − {code} (nats/token)")
            ax.legend(fontsize=8)
        row_axes[0].set_xticks([r["model"]["n_layers"] for r in report["rungs"]])
        row_axes[0].set_xticklabels([str(r["model"]["n_layers"]) for r in report["rungs"]])
    figure.suptitle(
        "The learned table's lead across the ladder (below 0: learned ahead; bars: 95% intervals)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _save_figure(figure, path)


def write_ladder(out_dir: str | Path, data: dict[str, Any], n_boot: int = stats.DEFAULT_BOOTSTRAP) -> dict:
    """Write ``report_data.json`` (the ladder's raw data), ``report.json``, ``report.md`` and
    ``figures/ladder.png`` into ``out_dir``; return the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = ladder_report(data, n_boot)
    write_json_atomic(out / "report_data.json", data)
    write_json_atomic(out / "report.json", report)
    write_text_atomic(out / "report.md", render_markdown(report))
    draw_ladder(report, out / "figures" / "ladder.png")
    return report
