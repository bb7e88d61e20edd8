"""``run_analysis``: load a checkpoint (and a reference), check that model, tokenizer, dataset and reference
belong together, compute the bit probes and the effective-embedding measures, and write ``analysis.json``,
``analysis.md`` and ``figures/*.png`` into one directory (built under a temporary name, renamed whole)."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tablefree.analysis.embeddings import (
    DEFAULT_PROBE_WORDS,
    frequency_r2,
    knn_overlap,
    nearest_neighbours,
    probe_word_ids,
    token_counts,
)
from tablefree.analysis.linear import cka_null, linear_cka
from tablefree.analysis.mlp import MLPProbeSettings
from tablefree.analysis.probes import DEFAULT_PROBE_RIDGE, code_sets, probe_code_bits, random_labels
from tablefree.analysis.render import ANALYSIS_JSON, write_analysis
from tablefree.analysis.spec import AnalyzeSpec
from tablefree.analysis.states import effective_embeddings, layer_names
from tablefree.checkpoint.layout import META_FILE, TOKENIZER_FILE
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.codes import num_bits
from tablefree.data.loader import MANIFEST, TokenLoader, read_manifest
from tablefree.data.tokenizer import tokenizer_hash
from tablefree.fileio import read_json
from tablefree.model import TablefreeLM, build_model

FIT_FRACTION = 0.75  # split="positions": 3/4 of the windows fit the probes, the other 1/4 score them
METHOD_VERSION = 2  # 2: type-disjoint probes with controls, debiased CKA with its null (issue 21)
CKA_PERMUTATIONS = 50  # row shuffles per CKA value for its null (the 95th percentile of 50)
FIT_ROWS_PER_FEATURE = 4  # the probes need at least 4·(d + 1) fit positions
NEIGHBOURS = 5  # nearest neighbours listed per probe word
KNN_K = 10  # neighbours compared per token in knn_overlap
KNN_QUERIES = 2_000  # the most frequent tokens whose neighbourhoods knn_overlap compares


def run_analysis(spec: AnalyzeSpec, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Analyse ``spec.checkpoint`` (``AnalyzeSpec`` says what each field means); returns the analysis dict.
    ``log`` receives a line per stage.

    Every probe is reported beside its controls: the untrained model of the same interface and seed (built from
    the checkpoint's config and the seed in its meta.json) and random per-type labels."""
    checkpoint, reference, data, out, tokenizer = (
        spec.checkpoint,
        spec.reference,
        spec.data,
        spec.out,
        spec.tokenizer,
    )
    positions, words, embedding_tokens, device, batch_size = (
        spec.positions,
        spec.words,
        spec.embedding_tokens,
        spec.device,
        spec.batch_size,
    )
    split, verify, mlp_probe = spec.split, spec.verify, spec.mlp_probe
    started = time.perf_counter()
    say = log or (lambda _message: None)
    out_dir = check_out_dir(out) if out is not None else None
    model, directory = load_model(checkpoint, device, verify=verify)
    data_dir = dataset_of(directory, data)
    manifest = read_manifest(data_dir)
    tok, tok_hash = matching_tokenizer(directory, data_dir, manifest, tokenizer, model.config.vocab_size)
    ref = load_reference(reference, model, tok_hash, device, verify) if reference is not None else None

    say(f"linear bit probes on {data_dir}/val ({split} split), with controls")
    fit, score = probe_windows(model, data_dir, positions, batch_size, split)
    seed = _meta(directory).get("seed")
    probes = controlled_probes(model, seed, fit, score, split)
    if mlp_probe:
        say("MLP bit probes, with the same controls")
        mlp_probes = controlled_probes(model, seed, fit, score, split, kind="mlp")
    say("effective embeddings")
    counts = torch.from_numpy(token_counts(data_dir, model.config.vocab_size))
    embeddings = embedding_measures(
        model, ref[0] if ref else None, tok, counts, words or DEFAULT_PROBE_WORDS, max_tokens=embedding_tokens
    )
    result = {
        "method_version": METHOD_VERSION,
        "checkpoint": str(directory),
        "step": _meta(directory).get("step"),
        "interface": model.config.interface.name,
        "model": {
            "d_model": model.config.d_model,
            "n_layers": model.config.n_layers,
            "vocab_size": model.config.vocab_size,
        },
        "reference": None
        if ref is None
        else {"checkpoint": str(ref[1]), "interface": ref[0].config.interface.name},
        "data": str(data_dir),
        "tokenizer_hash": tok_hash,
        "layers": layer_names(model),
        "probes": probes,
        **({"mlp_probes": mlp_probes} if mlp_probe else {}),
        "embeddings": embeddings,
        "seconds": round(time.perf_counter() - started, 2),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if out_dir is not None:
        write_analysis(result, out_dir)
        result["out"] = str(out_dir)
        say(f"analysis written to {out_dir}")
    return result


def check_out_dir(out: str | Path) -> Path:
    """The output directory, refused up front when it holds something other than an earlier analysis (it is
    replaced whole)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / ANALYSIS_JSON).exists())):
        raise FileExistsError(
            f"--out {out}: exists and is not an analysis directory (no {ANALYSIS_JSON}); the analysis replaces "
            "its output directory whole, so choose a new or an earlier analysis directory"
        )
    return out


def _meta(directory: Path) -> dict[str, Any]:
    path = directory / META_FILE
    return read_json(path) if path.exists() else {}


def dataset_of(directory: Path, data: str | Path | None) -> Path:
    """``data``, or the dataset the checkpoint was trained on (``data_dir`` in its meta.json)."""
    if data is not None:
        return Path(data)
    recorded = _meta(directory).get("data_dir")
    if not recorded:
        raise ValueError(f"{directory / META_FILE}: no data_dir recorded; pass --data DATASET")
    if not (Path(recorded) / MANIFEST).exists():
        raise FileNotFoundError(
            f"the dataset recorded in {directory / META_FILE} ({recorded}) has no {MANIFEST} here; pass --data DATASET"
        )
    return Path(recorded)


def matching_tokenizer(
    directory: Path, data_dir: Path, manifest: dict, tokenizer: str | Path | None, vocab_size: int
) -> tuple[Any, str]:
    """The checkpoint's tokenizer (or ``tokenizer``, checked against it), which must be the dataset's."""
    if tokenizer is None and not (directory / TOKENIZER_FILE).exists():
        tokenizer = data_dir / manifest.get("tokenizer_file", TOKENIZER_FILE)  # checked against meta.json
    tok, digest = checked_tokenizer(directory, tokenizer)
    expected = manifest.get("tokenizer_hash")
    if expected is not None and expected != digest:
        raise ValueError(
            f"{data_dir / MANIFEST}: the dataset was tokenized with tokenizer {expected[:12]}…, the checkpoint "
            f"{directory} uses {digest[:12]}…; analyse it on a dataset prepared with its tokenizer"
        )
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ValueError(f"tokenizer has {size} tokens, more than the model's vocab_size {vocab_size}")
    return tok, digest


def load_reference(
    reference: str | Path, model: TablefreeLM, tok_hash: str, device: str, verify: bool = True
) -> tuple[TablefreeLM, Path]:
    """The reference model, refused when its vocabulary or tokenizer differs from the model's."""
    ref, ref_dir = load_model(reference, device, verify=verify)
    if ref.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"reference {ref_dir}: vocabulary of {ref.config.vocab_size} ids, the model has "
            f"{model.config.vocab_size}; the reference must share the model's tokenizer and vocabulary"
        )
    ref_hash = _meta(ref_dir).get("tokenizer_hash")
    if ref_hash is None and (ref_dir / TOKENIZER_FILE).exists():
        ref_hash = tokenizer_hash(ref_dir / TOKENIZER_FILE)
    if ref_hash is not None and ref_hash != tok_hash:
        raise ValueError(
            f"reference {ref_dir}: tokenizer {ref_hash[:12]}…, the model's is {tok_hash[:12]}…; token ids "
            "would mean different strings, so the reference must share the model's tokenizer"
        )
    return ref, ref_dir


def probe_windows(
    model: TablefreeLM, data_dir: Path, positions: int, batch_size: int, split: str = "types"
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Held-out windows of ``max_seq_len`` tokens from the val split, spread evenly over all of it (so over its
    documents, not one section of one), as (fit, score) batches: with ``split="types"`` every window serves
    both (the probes split by token type); with ``positions`` alternate windows in a 3:1 pattern fit and score.
    Too little text is an error that says how much is needed."""
    seq_len = model.config.max_seq_len
    fit_needed = FIT_ROWS_PER_FEATURE * (model.config.d_model + 1)
    share = 0.5 if split == "types" else FIT_FRACTION  # about half the positions fit under the type split
    needed_windows = max(2, math.ceil(fit_needed / (share * seq_len)))
    available = _val_windows(data_dir, seq_len)
    if available < needed_windows:
        raise ValueError(
            f"{data_dir}: too little held-out text for the bit probes: they need at least "
            f"{needed_windows * seq_len:,} positions ({needed_windows} windows of {seq_len} tokens; "
            f"{FIT_ROWS_PER_FEATURE} × (d_model + 1) = {fit_needed:,} to fit, as many again to score), the val "
            f"split holds {available * seq_len:,} ({available} windows); prepare the dataset with a larger val split"
        )
    windows = min(available, max(needed_windows, math.ceil(positions / seq_len)))
    chosen = sorted({round(i * (available - 1) / max(1, windows - 1)) for i in range(windows)})
    loader = TokenLoader.from_dir(data_dir, "val", seq_len=seq_len, batch_size=1, shuffle=False)
    rows = [loader.batch(i)[0] for i in chosen]  # batch_size 1: window i is micro-step i

    def batches(part: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat(part[i : i + batch_size]) for i in range(0, len(part), batch_size)]

    if split == "types":
        return batches(rows), batches(rows)
    scored = {i for i in range(len(rows)) if i % 4 == 3} or {len(rows) - 1}
    return batches([r for i, r in enumerate(rows) if i not in scored]), batches(
        [r for i, r in enumerate(rows) if i in scored]
    )


def controlled_probes(
    model: TablefreeLM,
    seed: int | None,
    fit: list[torch.Tensor],
    score: list[torch.Tensor],
    split: str = "types",
    ridge: float = DEFAULT_PROBE_RIDGE,
    kind: str = "linear",
    mlp: MLPProbeSettings | None = None,
) -> dict[str, Any]:
    """The bit probes of ``model`` (``kind``: ``linear`` or ``mlp``, see ``probe_code_bits``) beside their
    controls: random per-type labels (a code set of its own) and the same probes on the untrained model of the
    same interface and ``seed`` (``build_model``, as training starts); per code set ``untrained_mean_accuracy``
    and ``selectivity`` = mean accuracy − that, per layer. Without a seed the untrained control is absent and
    ``controls`` says why."""
    vocab_size = model.config.vocab_size
    sets = [*code_sets(model), random_labels(vocab_size, num_bits(vocab_size))]
    options = {"ridge": ridge, "split": split, "sets": sets, "kind": kind, "mlp": mlp}
    probes = probe_code_bits(model, fit, score, **options)
    if seed is None:
        probes["controls"] = {"untrained": None, "why": "no training seed in the checkpoint's meta.json"}
        return probes
    device = next(model.parameters()).device
    untrained = build_model(model.config, int(seed), device).eval()
    control = probe_code_bits(untrained, fit, score, **options)
    probes["controls"] = {"untrained": {"seed": int(seed), "split": split}}
    for name, entry in probes["code_sets"].items():
        baseline = control["code_sets"][name]["mean_accuracy"]
        entry["untrained_mean_accuracy"] = baseline
        entry["selectivity"] = [a - b for a, b in zip(entry["mean_accuracy"], baseline, strict=True)]
    return probes


def _val_windows(data_dir: Path, seq_len: int) -> int:
    manifest = read_manifest(data_dir)
    if "val" not in manifest["splits"]:
        raise ValueError(f"{data_dir / MANIFEST}: no 'val' split, which the bit probes read")
    shards = manifest["splits"]["val"]["shards"]
    return sum(max(0, (shard["tokens"] - 1) // seq_len) for shard in shards)


def embedding_measures(
    model: TablefreeLM,
    reference: TablefreeLM | None,
    tokenizer: Any,
    counts: torch.Tensor,
    words: list[str] | tuple[str, ...],
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """Per layer: CKA with the reference's table and its E_ℓ, held-out R² of log frequency, k-NN overlap
    with the reference table; and the probe words' neighbours. Over the tokens seen in the train split (the
    ``max_tokens`` most frequent of them when given, which bounds the memory: (L + 1)·n·d floats)."""
    tokenizer_size = tokenizer.get_vocab_size(with_added_tokens=True)
    seen = counts > 0
    seen[tokenizer_size:] = False
    tokens = torch.nonzero(seen).squeeze(1)
    if max_tokens is not None and len(tokens) > max_tokens:
        frequent = torch.sort(counts[tokens], descending=True, stable=True).indices[:max_tokens]
        tokens = torch.sort(tokens[frequent]).values
    if len(tokens) < 20:
        raise ValueError(
            f"only {len(tokens)} distinct tokens occur in the train split; the embedding measures need at least 20"
        )
    # rows follow ``tokens``: E[i] is the effective embedding of id tokens[i]
    mine = effective_embeddings(model, tokens)
    theirs = effective_embeddings(reference, tokens) if reference is not None else None
    log_counts = counts[tokens].to(torch.float64).log()
    rows = torch.arange(len(tokens))
    queries = torch.sort(counts[tokens], descending=True, stable=True).indices[:KNN_QUERIES]
    what = "ids of the tokenizer that occur at least once in the train split"
    result: dict[str, Any] = {
        "tokens": len(tokens),
        "token_set": what if len(tokens) == int(seen.sum()) else f"the {len(tokens):,} most frequent {what}",
        "frequency_r2": [frequency_r2(e, log_counts) for e in mine],
    }
    if theirs is not None:
        result["cka"] = "debiased linear CKA (unbiased HSIC); null: 95th percentile over row shuffles"
        result["cka_reference_table"] = [linear_cka(e, theirs[0]) for e in mine]
        result["cka_reference_table_null95"] = [cka_null(e, theirs[0], CKA_PERMUTATIONS) for e in mine]
        result["cka_reference_layer"] = [
            linear_cka(e, theirs[i]) if i < len(theirs) else None for i, e in enumerate(mine)
        ]
        result["cka_reference_layer_null95"] = [
            cka_null(e, theirs[i], CKA_PERMUTATIONS) if i < len(theirs) else None for i, e in enumerate(mine)
        ]
        result["reference_frequency_r2"] = [frequency_r2(e, log_counts) for e in theirs]
        result["knn_overlap"] = {
            "k": KNN_K,
            "queries": len(queries),
            "chance": KNN_K / (len(tokens) - 1),
            "values": [knn_overlap(e, theirs[0], queries, rows, KNN_K) for e in mine],
        }
    result["neighbours"] = _word_neighbours(mine, theirs, tokenizer, tokens, words)
    return result


def _word_neighbours(
    mine: list[torch.Tensor],
    theirs: list[torch.Tensor] | None,
    tokenizer: Any,
    tokens: torch.Tensor,
    words: list[str] | tuple[str, ...],
) -> dict[str, Any]:
    analysed = torch.zeros(int(tokens.max()) + 1, dtype=torch.bool)
    analysed[tokens] = True
    chosen = probe_word_ids(tokenizer, words, analysed)
    queries = torch.searchsorted(
        tokens, torch.tensor([token_id for _, token_id in chosen], dtype=torch.int64)
    )
    rows = torch.arange(len(tokens))
    entries = [{"word": word, "id": token_id} for word, token_id in chosen]

    def strings(found: torch.Tensor) -> list[list[str]]:
        return [[tokenizer.decode([int(tokens[i])]) for i in row] for row in found]

    if chosen:
        per_layer = [strings(nearest_neighbours(e, queries, rows, NEIGHBOURS)) for e in mine]
        reference = strings(nearest_neighbours(theirs[0], queries, rows, NEIGHBOURS)) if theirs else None
        for index, entry in enumerate(entries):
            entry["layers"] = [layer[index] for layer in per_layer]
            entry["reference_table"] = reference[index] if reference else None
    left_out = [w for w in words if w not in {word for word, _ in chosen}]
    # left out: not one token of the tokenizer, or not among the analysed (seen) tokens
    return {"k": NEIGHBOURS, "words": entries, "left_out": left_out}
