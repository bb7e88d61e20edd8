"""Where in the vocabulary the gap lives: the validation-loss gap of two interfaces split by the training-split
frequency band of the input token and of the target token (the bands and the tallies:
``tablefree.evaluate.frequency_bands``).

Per side (input, target) and band: its share of the validation tokens, each interface's loss on it (mean over
seeds), and per compared pair A − B on the band's tokens, paired by seed, with the interval of
``tablefree.stats.paired_difference`` (the wider of the seed t and the seeds + a bootstrap over validation
documents, the same documents for both interfaces and every seed), and its contribution to the whole gap,
share × band gap. The contributions of one side add up exactly to the whole gap, since every token lies in one
band of each side. The bands are descriptive: their intervals are not corrected for the number of bands.

``band_split`` is pure (the tallies of each interface's runs, by seed); ``sweep_frequency_bands`` reads a sweep's
runs (compare's report), ``frequency_band_analysis`` scores two checkpoints (``tablefree analyze
--frequency-bands``); ``frequency_bands_markdown`` renders either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tablefree import stats
from tablefree.analysis.run import dataset_of
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.evaluate.frequency_bands import SIDES
from tablefree.evaluate.validation import validation_metrics
from tablefree.fileio import strict_json, write_json_atomic, write_text_atomic

VALIDATION = "validation"
BANDS_JSON = "frequency_bands.json"
BANDS_MD = "frequency_bands.md"


def band_split(
    tallies: dict[str, dict[int, dict[str, Any]]],
    pairs: Sequence[tuple[str, str]],
    n_boot: int = stats.DEFAULT_BOOTSTRAP,
    one_seed_interval: bool = False,
) -> dict[str, Any]:
    """The gap of each pair (A, B) split by frequency band. ``tallies``: interface → seed → the ``frequency_bands``
    entry of that run's validation results. Pairs are matched on the seeds both interfaces have. Raises
    ValueError when the runs were not scored on the same bands and tokens (then no split is meaningful).
    ``one_seed_interval``: with one seed, the document bootstrap alone (two checkpoints, not a sweep)."""
    named = [name for pair in pairs for name in pair if name in tallies]
    tallies = {name: tallies[name] for name in [*dict.fromkeys(named), *tallies]}  # the pairs' order
    entries = [entry for by_seed in tallies.values() for entry in by_seed.values()]
    if not entries:
        raise ValueError("no run has frequency-band tallies")
    definition = {k: v for k, v in entries[0].items() if k not in SIDES}
    for entry in entries[1:]:
        if {k: v for k, v in entry.items() if k not in SIDES} != definition:
            raise ValueError(
                "the runs' frequency bands differ (scored on different datasets or vocabularies)"
            )
        for side in SIDES:
            if entry[side]["tokens"] != entries[0][side]["tokens"]:
                raise ValueError(
                    "the runs were scored on different validation tokens (another limit or split)"
                )
    out: dict[str, Any] = {"definition": definition, "sides": {}}
    for side in SIDES:
        tokens = np.asarray(entries[0][side]["tokens"], dtype=np.float64)  # (documents, bands)
        nats = {
            name: {seed: np.asarray(e[side]["nats"], dtype=np.float64) for seed, e in by_seed.items()}
            for name, by_seed in tallies.items()
        }
        total = tokens.sum()
        band_rows = []
        for band in range(definition["bands"]):
            count = tokens[:, band].sum()
            band_rows.append(
                {
                    **definition["band_table"][band],
                    "tokens": int(count),
                    "share": float(count / total),
                    "loss": {
                        name: float(np.mean([n[:, band].sum() / count for n in by_seed.values()]))
                        if count
                        else None
                        for name, by_seed in nats.items()
                    },
                }
            )
        out["sides"][side] = {
            "bands": band_rows,
            "pairs": [
                _pair_split(a, b, nats, tokens, n_boot, one_seed_interval)
                for a, b in pairs
                if a in nats and b in nats and set(nats[a]) & set(nats[b])
            ],
        }
        out["documents"], out["tokens"] = int((tokens.sum(axis=1) > 0).sum()), int(total)
    return out


def _pair_split(
    a: str,
    b: str,
    nats: dict[str, dict[int, np.ndarray]],
    tokens: np.ndarray,
    n_boot: int,
    one_seed_interval: bool,
) -> dict[str, Any]:
    seeds = sorted(set(nats[a]) & set(nats[b]))
    sums_a = np.stack([nats[a][s] for s in seeds])  # (seeds, documents, bands)
    sums_b = np.stack([nats[b][s] for s in seeds])
    total = tokens.sum()

    def difference(columns: slice | int) -> stats.Difference:
        return stats.paired_difference(
            sums_a[:, :, columns].reshape(len(seeds), tokens.shape[0], -1).sum(axis=2),
            sums_b[:, :, columns].reshape(len(seeds), tokens.shape[0], -1).sum(axis=2),
            tokens[:, columns].reshape(tokens.shape[0], -1).sum(axis=1),
            n_boot=n_boot,
            one_seed_interval=one_seed_interval,
        )

    whole = difference(slice(None))
    bands = []
    for band in range(tokens.shape[1]):
        share = float(tokens[:, band].sum() / total)
        if share == 0:
            bands.append({"band": band, "estimate": None, "contribution": 0.0})
            continue
        d = difference(band)
        bands.append(
            {
                "band": band,
                **d.as_dict(),
                "contribution": share * d.estimate,
                "contribution_low": None if d.low is None else share * d.low,
                "contribution_high": None if d.high is None else share * d.high,
            }
        )
    return {
        "a": a,
        "b": b,
        "seeds": seeds,
        "whole": whole.as_dict(),
        "bands": bands,
        "sum_of_contributions": float(sum(row["contribution"] for row in bands)),
    }


NO_TALLIES_WHY = "evaluated before they existed, or on a dataset without a training split"


def run_tallies(runs: Sequence[Any]) -> tuple[dict[str, dict[int, dict[str, Any]]], list[str]]:
    """The validation tallies of evaluated runs (duck-typed: ``interface``, ``seed``, ``name``, ``eval``) as
    ``band_split`` takes them (interface → seed → entry), and the names of the runs that have none."""
    tallies: dict[str, dict[int, dict[str, Any]]] = {}
    missing = []
    for run in runs:
        entry = ((run.eval.get("tasks") or {}).get(VALIDATION) or {}).get("frequency_bands")
        if entry:
            tallies.setdefault(run.interface, {})[run.seed] = entry
        else:
            missing.append(str(run.name))
    return tallies, missing


def sweep_frequency_bands(
    runs: Sequence[Any],
    points: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    n_boot: int,
    own_points: Sequence[dict[str, str]] = (),
) -> list[dict[str, Any]]:
    """Per grid point, the band split of the finished runs' validation results (duck-typed on the report's run
    records: ``interface``, ``seed``, ``point``, ``eval``), or the reason there is none. Then one split per
    mapping in ``own_points`` (interface → the grid point of its own best rate, as a rate check chose it) whose
    interfaces sit at different points: each interface's runs at its own point, paired by seed, labelled
    ``own best rates (...)`` and keeping the mapping as ``own_points``."""
    groups: list[tuple[str, list[Any], dict[str, str] | None]] = [
        (point, [run for run in runs if getattr(run, "point", "") == point], None) for point in points
    ]
    for chosen in own_points:
        if len(set(chosen.values())) > 1:
            label = "own best rates (" + ", ".join(f"{name} {point}" for name, point in chosen.items()) + ")"
            here = [run for run in runs if chosen.get(run.interface) == getattr(run, "point", "")]
            groups.append((label, here, dict(chosen)))
    out = []
    for label, group, chosen in groups:
        tallies, missing = run_tallies([run for run in group if run.eval is not None])
        mapping = {"own_points": chosen} if chosen else {}
        if missing:
            out.append(
                {
                    "point": label,
                    **mapping,
                    "unavailable": f"{len(missing)} run(s) have no frequency-band tallies ({', '.join(missing[:4])}"
                    + (", …" if len(missing) > 4 else "")
                    + f"): {NO_TALLIES_WHY}; the sweep's compare command evaluates them again",
                }
            )
            continue
        if not tallies:
            continue
        try:
            out.append({"point": label, **mapping, **band_split(tallies, pairs, n_boot)})
        except ValueError as error:
            out.append({"point": label, **mapping, "unavailable": str(error)})
    return out


def frequency_band_analysis(
    checkpoint: str | Path,
    reference: str | Path,
    data: str | Path | None = None,
    out: str | Path | None = None,
    *,
    device: str = "cpu",
    batch_size: int = 8,
    n_boot: int = stats.DEFAULT_BOOTSTRAP,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The band split of the validation loss of ``checkpoint`` against ``reference`` (checkpoint − reference) on
    ``data``'s validation split (default: the dataset ``checkpoint`` was trained on), one seed: the intervals
    are the document bootstrap's alone. Writes ``frequency_bands.json`` and ``frequency_bands.md`` into ``out``
    when given."""
    names, entries = [], []
    for path in (checkpoint, reference):
        model, directory = load_model(path, device)
        data = dataset_of(directory, data)
        tokenizer, tokenizer_hash = checked_tokenizer(directory)
        if log:
            log(f"scoring {directory} on {data}'s validation split")
        result = validation_metrics(model, tokenizer, str(data), tokenizer_hash, batch_size=batch_size)
        if result["frequency_bands"] is None:
            raise ValueError(f"{data}: no train split, on which the frequency bands are counted")
        names.append(model.config.interface.name)
        entries.append(result["frequency_bands"])
    if names[0] == names[1]:
        names = [f"{names[0]} ({Path(checkpoint).name})", f"{names[1]} ({Path(reference).name})"]
    split = band_split(
        {names[0]: {0: entries[0]}, names[1]: {0: entries[1]}},
        [(names[0], names[1])],
        n_boot=n_boot,
        one_seed_interval=True,
    )
    result = {"checkpoint": str(checkpoint), "reference": str(reference), "data": str(data), **split}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(out) / BANDS_JSON, strict_json(result))
        write_text_atomic(Path(out) / BANDS_MD, frequency_bands_markdown([result], heading="#"))
    return result


# ------------------------------------------------------------------------------------------------------------
# Markdown


def frequency_bands_markdown(sections: list[dict[str, Any]], heading: str = "##") -> str:
    """The section of ``report.md`` (or ``analysis``'s file): per grid point and side, a table of the bands."""
    if not sections:
        return ""
    lines = [f"{heading} Where the gap lives in the vocabulary", ""]
    definition = next((s["definition"] for s in sections if "definition" in s), None)
    if definition:
        lines += [
            f"Token types are banded by their frequency in the training split ({definition['train_tokens']:,} "
            f"tokens): {definition['bands']} bands of about equal training-token mass ({definition['scheme']}; "
            "band 0 the most frequent types, each band about a fifth of the text, so every band is measured "
            "with about the same precision and means the same in any vocabulary). Each validation token is "
            "counted in the band of its input token (what the interface is fed) and, separately, of its target "
            "token (what the head predicts). A band's gap is A − B on its tokens, paired by seed, with the "
            "wider of the seed t and the seeds + document-bootstrap interval (95%, not corrected for the "
            "number of bands); its contribution is share × gap, and the contributions of a side add up "
            "to the whole gap.",
            "",
        ]
    split = [s for s in sections if "sides" in s]
    if len(split) > 1:
        lines += _summary(split)
    for section in sections:
        label = f" at {section['point']}" if section.get("point") else ""
        if "unavailable" in section:
            lines += [f"No band split{label}: {section['unavailable']}.", ""]
            continue
        for side in SIDES:
            part = section["sides"][side]
            names = list(part["bands"][0]["loss"])
            header = ["band", "types", "per million (train)", "share"] + [f"{n} loss" for n in names]
            for pair in part["pairs"]:
                header += [f"{pair['a']} − {pair['b']} [95% CI]", "contribution"]
            lines += [
                f"**By {side} token{label}** ({section['tokens']:,} tokens, {section['documents']} documents):",
                "",
                "| " + " | ".join(header) + " |",
                "|" + "---|" * len(header),
            ]
            for row in part["bands"]:
                cells = [
                    str(row["band"]),
                    str(row["types"]),
                    _range(row["min_per_million"], row["max_per_million"]),
                    f"{100 * row['share']:.1f}%",
                ] + [_num(row["loss"][n]) for n in names]
                for pair in part["pairs"]:
                    cell = pair["bands"][row["band"]]
                    cells += [_interval(cell), _num(cell["contribution"])]
                lines.append("| " + " | ".join(cells) + " |")
            whole = ["all", "", "", "100%"] + ["" for _ in names]
            for pair in part["pairs"]:
                whole += [_interval(pair["whole"]), _num(pair["sum_of_contributions"])]
            lines += ["| " + " | ".join(whole) + " |", ""]
            for pair in part["pairs"]:
                seeds = len(pair["seeds"])
                lines.append(
                    f"- {pair['a']} − {pair['b']} by {side} token ({seeds} seed{'s' * (seeds != 1)}): "
                    + _reading(pair, part["bands"])
                )
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _summary(sections: list[dict[str, Any]]) -> list[str]:
    """One row per grid point, side and pair: each band's gap with its interval, and the whole gap."""
    bands = sections[0]["definition"]["bands"]
    header = ["point", "side", "pair"] + [f"band {b}" for b in range(bands)] + ["whole gap"]
    lines = [
        "Each band's gap A − B (nats/token on the band's tokens, 95% interval) at every grid point (and at the "
        "interfaces' own best rates); the "
        "tables below give shares, losses and contributions:",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for section in sections:
        for side in SIDES:
            for pair in section["sides"][side]["pairs"]:
                cells = [section.get("point") or "–", side, f"{pair['a']} − {pair['b']}"]
                cells += [_interval(cell) for cell in pair["bands"]] + [_interval(pair["whole"])]
                lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _reading(pair: dict[str, Any], bands: list[dict[str, Any]]) -> str:
    """Which bands carry the gap: each band's share of the gap beside its share of the tokens."""
    whole = pair["whole"]["estimate"]
    if not whole:
        return "no gap to split."
    parts = [
        f"band {row['band']} holds {100 * bands[row['band']]['share']:.0f}% of the tokens and "
        f"{100 * row['contribution'] / whole:.0f}% of the gap"
        for row in pair["bands"]
    ]
    resolved = [str(row["band"]) for row in pair["bands"] if _excludes_zero(row)]
    tail = (
        f"; the interval excludes 0 in band{'s' * (len(resolved) != 1)} {', '.join(resolved)}"
        if resolved
        else ""
    )
    return "; ".join(parts) + tail + "."


def _excludes_zero(row: dict[str, Any]) -> bool:
    return row.get("low") is not None and (row["low"] > 0 or row["high"] < 0)


def _interval(cell: dict[str, Any]) -> str:
    if cell.get("estimate") is None:
        return "—"
    if cell.get("low") is None:
        return _num(cell["estimate"])
    return f"{_num(cell['estimate'])} [{_num(cell['low'])}, {_num(cell['high'])}]"


def _range(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "—"
    return f"{stats.fmt(low, 2)}–{stats.fmt(high, 2)}"


def _num(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4f}"
