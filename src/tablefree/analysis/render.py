"""The analysis as files: ``analysis.json``, ``analysis.md`` (a markdown section another report can include)
and per-layer figures (``figures/probes.png``, ``figures/embeddings.png``), written as one directory."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from tablefree.fileio import (
    staged_directory,
    strict_json,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)

ANALYSIS_JSON, ANALYSIS_MD, FIGURES = "analysis.json", "analysis.md", "figures"
PROBE_FIGURE, EMBEDDING_FIGURE = "probes.png", "embeddings.png"


def write_analysis(result: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the analysis directory whole (built under a temporary name, then renamed into place)."""
    out_dir = Path(out_dir)
    with staged_directory(out_dir) as stage:
        (stage / FIGURES).mkdir()
        draw_analysis_figures(result, stage / FIGURES)
        write_json_atomic(stage / ANALYSIS_JSON, strict_json(result))
        write_text_atomic(stage / ANALYSIS_MD, analysis_markdown(result) + "\n")
    return out_dir


# ------------------------------------------------------------------------------------------------------------
# Markdown


def analysis_markdown(
    result: dict[str, Any], level: int = 2, figures: str = FIGURES, title: str | None = None
) -> str:
    """The analysis as a markdown section: a per-layer table, the probe words' neighbours and the figures.

    ``level``: heading level of the section; ``figures``: the figures' directory as seen from the markdown
    file; ``title``: the heading (default: the interface and checkpoint)."""
    hashes = "#" * level
    heading = title or f"Analysis of `{result['interface']}` ({result['checkpoint']})"
    reference = result.get("reference")
    probes = result["probes"]
    lines = [
        f"{hashes} {heading}",
        "",
        f"Reference: {_reference_text(reference)}. Dataset: `{result['data']}`. Bit probes: linear (ridge "
        f"{probes['ridge']:g}) fitted on {probes['positions']['fit']:,} positions of the val split, scored on "
        f"{probes['positions']['score']:,} others; {_split_text(probes)} Embedding measures over "
        f"{result['embeddings']['tokens']:,} tokens ({result['embeddings']['token_set']}).",
        "",
        f"{hashes}# Per layer",
        "",
        *_layer_table(result),
        "",
        _probe_note(probes, result["embeddings"]),
        "",
    ]
    lines += _mlp_section(result, hashes)
    lines += _neighbour_section(result, hashes)
    lines += [
        f"{hashes}# Figures",
        "",
        f"![bit probes per layer]({figures}/{PROBE_FIGURE})",
        "",
        f"![effective embeddings per layer]({figures}/{EMBEDDING_FIGURE})",
    ]
    return "\n".join(lines)


def _split_text(probes: dict[str, Any]) -> str:
    types = probes.get("types") or {}
    if probes.get("split", "positions") == "types":
        return (
            f"type-disjoint: fitted on {types.get('fit', 0):,} token types, scored on {types.get('score', 0):,} "
            "others (a probe that memorised types scores at chance)."
        )
    return (
        f"split by position: {probes.get('shared_types', '?')} token types occur in both (a probe can memorise "
        "them)."
    )


def _reference_text(reference: dict[str, Any] | None) -> str:
    if reference is None:
        return "none (no CKA, neighbour overlap or reference neighbours)"
    return f"`{reference['interface']}` model {reference['checkpoint']}"


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _layer_table(result: dict[str, Any]) -> list[str]:
    sets = result["probes"]["code_sets"]
    emb = result["embeddings"]
    columns = ["layer"]
    columns += [f"{name} bits: mean / min linear probe acc. (selectivity)" for name in sets]
    columns += ["log-freq. R²"]
    with_reference = "cka_reference_table" in emb
    if with_reference:
        columns += [
            "reference log-freq. R²",
            "CKA vs ref. table (null 95%)",
            "CKA vs ref. same layer (null 95%)",
        ]
        columns += [f"{emb['knn_overlap']['k']}-NN overlap with ref. table"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for layer, name in enumerate(result["layers"]):
        cells = [f"{layer} ({name})", *_probe_cells(sets, layer)]
        cells.append(_num(emb["frequency_r2"][layer]))
        if with_reference:
            ref_r2 = emb["reference_frequency_r2"]
            cells.append(_num(ref_r2[layer]) if layer < len(ref_r2) else "–")
            for key in ("cka_reference_table", "cka_reference_layer"):
                null = (emb.get(f"{key}_null95") or [None] * (layer + 1))[layer]
                cells.append(_cka_cell(emb[key][layer], null))
            cells.append(_pct(emb["knn_overlap"]["values"][layer]))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _probe_cells(sets: dict[str, Any], layer: int) -> list[str]:
    """Per code set: mean / min accuracy over the bits at ``layer``, with the selectivity in brackets."""
    cells = []
    for s in sets.values():
        selectivity = s.get("selectivity")
        extra = f" ({_signed_pct(selectivity[layer])})" if selectivity else ""
        cells.append(f"{_pct(s['mean_accuracy'][layer])} / {_pct(s['min_accuracy'][layer])}{extra}")
    return cells


def _mlp_section(result: dict[str, Any], hashes: str) -> list[str]:
    """The MLP probe's table (only when the analysis has one)."""
    mlp = result.get("mlp_probes")
    if mlp is None:
        return []
    settings = mlp["mlp"]
    sets = mlp["code_sets"]
    columns = ["layer", *(f"{name} bits: mean / min MLP probe acc. (selectivity)" for name in sets)]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for layer, name in enumerate(result["layers"]):
        rows.append("| " + " | ".join([f"{layer} ({name})", *_probe_cells(sets, layer)]) + " |")
    return [
        f"{hashes}# MLP probe (nonlinear)",
        "",
        f"The same positions, split and controls, read by one small MLP per layer and code set instead of a "
        f"linear probe ({settings['hidden']} ReLU units in one hidden layer, AdamW for {settings['steps']:,} "
        f"steps of {settings['batch']} rows, seed {settings['seed']}). It can read an XOR of code bits (an "
        "`affine` model's canonical bits), which a linear probe cannot; selectivity is against the same MLP "
        "probe on the untrained model.",
        "",
        *rows,
        "",
    ]


def _signed_pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:+.1f} pts"


def above_null(value: float | None, null: float | None) -> bool:
    """Whether a CKA value is above its permutation null's 95th percentile (only such a value gets words)."""
    return value is not None and null is not None and value > null


def _cka_cell(value: float | None, null: float | None) -> str:
    if value is None:
        return "–"
    if null is None:
        return _num(value)
    return f"{_num(value)} ({_num(null)})" + ("" if above_null(value, null) else " n.s.")


def _probe_note(probes: dict[str, Any], embeddings: dict[str, Any]) -> str:
    baselines = ", ".join(
        f"{name} bits {_pct(s['mean_majority_baseline'])}" for name, s in probes["code_sets"].items()
    )
    untrained = (probes.get("controls") or {}).get("untrained")
    control = (
        f"Selectivity (in brackets) is the mean accuracy minus that of the same probe on the untrained model of "
        f"the same interface and seed ({untrained['seed']}): what training added. The `random labels` row set "
        "is the other control: random bits per token type, readable only by memorising types."
        if untrained
        else f"No untrained control: {(probes.get('controls') or {}).get('why', 'not computed')}."
    )
    note = (
        f"{control} The constant probe that always answers a bit's more common value scores on average "
        f"{baselines} (not 50%: real text uses some ids far more than others)."
    )
    if "cka_reference_table_null95" in embeddings:
        note += (
            " CKA is the debiased estimator; in brackets the 95th percentile of its permutation null (rows "
            "shuffled); n.s.: not above it, so no structure shared with the reference is shown."
        )
    knn = embeddings.get("knn_overlap")
    if knn:
        note += (
            f" The k-NN overlap is the share of each of the {knn['queries']:,} most frequent tokens' {knn['k']} "
            f"nearest neighbours (cosine) that the layer and the reference table agree on; chance ≈ "
            f"{_pct(knn['chance'])}."
        )
    return note


def _neighbour_section(result: dict[str, Any], hashes: str) -> list[str]:
    neighbours = result["embeddings"]["neighbours"]
    if not neighbours["words"]:
        return [
            f"{hashes}# Nearest neighbours",
            "",
            "No probe word is a single seen token of this tokenizer.",
            "",
        ]
    layers = len(result["layers"])
    shown = sorted({0, layers // 2, layers - 1})
    has_reference = neighbours["words"][0].get("reference_table") is not None
    columns = ["word"] + (["reference table"] if has_reference else [])
    columns += [f"layer {layer} ({result['layers'][layer]})" for layer in shown]
    lines = [
        f"{hashes}# Nearest neighbours",
        "",
        f"The {neighbours['k']} nearest tokens (cosine) of each probe word's effective embedding E_ℓ (the token "
        "alone, at position 0); all layers are in analysis.json.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for entry in neighbours["words"]:
        cells = [_token(entry["word"])]
        if has_reference:
            cells.append(" ".join(_token(t) for t in entry["reference_table"]))
        cells += [" ".join(_token(t) for t in entry["layers"][layer]) for layer in shown]
        lines.append("| " + " | ".join(cells) + " |")
    if neighbours.get("left_out"):
        left_out = ", ".join(_token(w) for w in neighbours["left_out"])
        lines += ["", f"Left out (not one token of the tokenizer, or unseen in training): {left_out}."]
    return [*lines, ""]


def _token(text: str) -> str:
    """A token as an inline code span that survives a markdown table (spaces shown, pipes escaped)."""
    shown = repr(text)[1:-1].replace("|", "\\|").replace("`", "'")
    return f"`{shown.replace(' ', '␣')}`"


# ------------------------------------------------------------------------------------------------------------
# Figures (matplotlib, Agg backend)


def draw_analysis_figures(result: dict[str, Any], figures_dir: Path) -> list[Path]:
    """``probes.png`` (linear probe accuracy per layer and bit, and its mean against the baseline, with the MLP
    probe's mean when there is one) and
    ``embeddings.png`` (CKA, log-frequency R² and k-NN overlap per layer); each written atomically."""
    # matplotlib is imported where a figure is drawn: it is heavy, and only the verbs that draw need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    paths = []
    for name, draw in ((PROBE_FIGURE, _probe_figure), (EMBEDDING_FIGURE, _embedding_figure)):
        figure = draw(result)
        paths.append(figures_dir / name)
        _save(figure, paths[-1])
    return paths


def _save(figure: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    write_bytes_atomic(path, buffer.getvalue())


def _title(result: dict[str, Any]) -> str:
    return f"{result['interface']} — {Path(result['checkpoint']).name}"


def _probe_figure(result: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    sets = result["probes"]["code_sets"]
    layers = np.arange(len(result["layers"]))
    figure, axes = plt.subplots(1, len(sets) + 1, figsize=(5.2 * (len(sets) + 1), 4.0), squeeze=False)
    axes = axes[0]
    for ax, (name, code_set) in zip(axes, sets.items(), strict=False):
        image = ax.imshow(
            np.asarray(code_set["accuracy"]).T,
            aspect="auto",
            origin="lower",
            vmin=0.5,
            vmax=1.0,
            cmap="viridis",
        )
        ax.set_xlabel("layer ℓ (0 = interface output)")
        ax.set_ylabel("bit")
        ax.set_title(f"{name} bits: linear probe accuracy")
        ax.set_xticks(layers)
        figure.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[-1]
    mlp_sets = (result.get("mlp_probes") or {}).get("code_sets", {})
    for name, code_set in sets.items():
        (line,) = ax.plot(layers, code_set["mean_accuracy"], marker="o", label=f"{name} bits (mean)")
        ax.plot(layers, code_set["min_accuracy"], ls=":", color=line.get_color(), label=f"{name} bits (min)")
        ax.axhline(code_set["mean_majority_baseline"], ls="--", color=line.get_color(), lw=0.8)
        if name in mlp_sets:
            ax.plot(
                layers,
                mlp_sets[name]["mean_accuracy"],
                marker="^",
                ls="-.",
                color=line.get_color(),
                label=f"{name} bits (MLP probe, mean)",
            )
    ax.set_ylim(0.45, 1.02)
    ax.set_xticks(layers)
    ax.set_xlabel("layer ℓ")
    ax.set_ylabel("held-out accuracy (dashed: majority baseline)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    how = "by linear probes (dash-dot: MLP probe)" if mlp_sets else "by linear probes"
    figure.suptitle(f"{_title(result)}: current-token code bits read from the residual state {how}")
    figure.tight_layout()
    return figure


def _embedding_figure(result: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    emb = result["embeddings"]
    layers = np.arange(len(result["layers"]))

    def values(series: list[float | None]) -> np.ndarray:
        return np.asarray([np.nan if v is None else v for v in series], dtype=float)

    with_reference = "cka_reference_table" in emb
    figure, axes = plt.subplots(1, 3 if with_reference else 1, figsize=(15 if with_reference else 5.2, 4.0))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    ax.plot(layers, values(emb["frequency_r2"]), marker="o", label=result["interface"])
    if with_reference:
        ref = values(emb["reference_frequency_r2"])
        ax.plot(
            np.arange(len(ref)),
            ref,
            marker="s",
            ls="--",
            label=f"reference ({result['reference']['interface']})",
        )
    ax.set_title("log token frequency read linearly from E_ℓ")
    ax.set_ylabel("held-out R² (5-fold)")
    if with_reference:
        ax = axes[1]
        ax.plot(layers, values(emb["cka_reference_table"]), marker="o", label="vs reference table (its E_0)")
        ax.plot(layers, values(emb["cka_reference_layer"]), marker="s", label="vs reference E_ℓ")
        ax.set_ylim(0, 1.02)
        ax.set_title("linear CKA")
        ax = axes[2]
        knn = emb["knn_overlap"]
        ax.plot(layers, values(knn["values"]), marker="o")
        ax.axhline(knn["chance"], ls="--", color="grey", lw=0.8, label="chance")
        ax.set_title(f"{knn['k']}-NN overlap with the reference table ({knn['queries']} frequent tokens)")
        ax.set_ylim(0, 1.02)
    for ax in axes:
        ax.set_xlabel("layer ℓ (0 = interface output)")
        ax.set_xticks(layers)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"{_title(result)}: effective embeddings E_ℓ (each token alone)")
    figure.tight_layout()
    return figure
