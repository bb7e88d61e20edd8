"""The regime a sweep ran in, beside the papers' (docs/results.md): training tokens per trainable parameter, the
learned table's share of the parameters, and the code's width against the model's (K/d).

A gap measured at about one token per parameter, with the table a quarter of the model, says little by itself
about a 1.7B model trained on 55 tokens per parameter whose table is 6% of it; the report puts the numbers side
by side so that no reader has to work them out.
"""

from __future__ import annotations

import math
from typing import Any

from tablefree.config_parsing import load_yaml
from tablefree.model_config import preset
from tablefree.params import param_breakdown
from tablefree.report import comparison
from tablefree.rundir import RUN_FILES, Run

# The two studies the project follows: their model presets and training tokens.
PAPERS = (
    {"study": "1.7B study (three runs, 100B tokens each)", "preset": "paper-1.7b", "tokens": 100e9},
    {"study": "earlier study (3 seeds, about 17B tokens)", "preset": "paper-32l-1024", "tokens": 17e9},
)


def regime(runs: list[Run], points: list[str]) -> list[dict[str, Any]]:
    """One row per grid point with a finished learned run (whose parameters include the table), then the papers'."""
    rows: list[dict[str, Any]] = []
    for point in points:
        learned = [r for r in comparison.finished(runs) if r.point == point and r.interface == "learned"]
        if not learned or not (learned[0].summary or {}).get("params"):
            continue
        run = learned[0]
        model = load_yaml(run.directory / RUN_FILES["config"]).get("model") or {}
        params = run.summary["params"]
        row = _row(
            f"this sweep{f' ({point})' if point else ''}",
            tokens=float(run.summary.get("tokens_seen") or 0),
            total=int(params["learned_total"]),
            vocab=int(model["vocab_size"]),
            width=int(model["d_model"]),
        )
        same = [r for r in rows if {**r, "study": ""} == {**row, "study": ""}]
        if same:  # points that differ in something else (the learning rate): one row for the regime
            same[0]["study"] = "this sweep"
            continue
        rows.append(row)
    if not rows:
        return []
    for paper in PAPERS:
        config = preset(paper["preset"], interface="learned")
        breakdown = param_breakdown(config)  # on the meta device: nothing is allocated
        rows.append(
            _row(
                paper["study"],
                tokens=paper["tokens"],
                total=breakdown.learned_total,
                vocab=config.vocab_size,
                width=config.d_model,
            )
        )
    return rows


def _row(study: str, tokens: float, total: int, vocab: int, width: int) -> dict[str, Any]:
    bits = math.ceil(math.log2(vocab))
    return {
        "study": study,
        "tokens": tokens,
        "params_learned": total,
        "tokens_per_param": tokens / total,
        "table_share": vocab * width / total,
        "code_bits": bits,
        "d_model": width,
        "bits_per_width": bits / width,
    }
