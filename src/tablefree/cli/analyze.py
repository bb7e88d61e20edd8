"""``tablefree analyze``: bit probes and effective embeddings of a checkpoint (Python API:
``tablefree.analysis.run_analysis``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tablefree.analysis.embeddings import DEFAULT_PROBE_WORDS
from tablefree.analysis.frequency_bands import BANDS_MD, frequency_band_analysis
from tablefree.analysis.run import run_analysis
from tablefree.analysis.spec import DEFAULT_POSITIONS, AnalyzeSpec


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="what the layers build from the input: bit probes per layer, effective embeddings vs a learned table",
        description="Probe each layer's residual state on held-out text for the current token's code bits "
        "(linear probes; with --mlp-probe also a one-hidden-layer MLP probe), and "
        "compare the effective embeddings E_l(t) (the state after layer l for token t alone) with a reference "
        "model's learned table: linear CKA, log-frequency R², nearest neighbours. Writes analysis.json, "
        "analysis.md and figures/*.png into --out (see docs/analysis.md). Python API: "
        "tablefree.analysis.run_analysis(AnalyzeSpec(checkpoint, reference=..., data=..., out=..., positions=..., "
        "words=..., device=..., split=..., mlp_probe=...)). With --frequency-bands, instead: the validation loss of "
        "the checkpoint against --reference split by the training-split frequency of the input and of the target "
        "token (frequency_bands.json and .md; Python API: "
        "tablefree.analysis.frequency_bands.frequency_band_analysis(checkpoint, reference, data=..., out=...)).",
    )
    parser.add_argument(
        "checkpoint", help="checkpoint directory, run directory, or directory of step_* checkpoints"
    )
    parser.add_argument(
        "--reference",
        default=None,
        help="a checkpoint with the same tokenizer to compare against, normally the learned model of the "
        "same seed (default: none; CKA, k-NN overlap and reference neighbours are then left out)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="prepared dataset: its val split feeds the probes, its train split gives token frequencies "
        "(default: the dataset recorded in the checkpoint's meta.json)",
    )
    parser.add_argument(
        "--out", default=None, help="output directory, replaced whole (default: CHECKPOINT/analysis)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json to use (must match the checkpoint's and the dataset's)",
    )
    parser.add_argument(
        "--positions",
        type=positive_int,
        default=DEFAULT_POSITIONS,
        help="held-out positions for the bit probes: under the type split about half fit and half score, under "
        "the position split 3/4 fit and 1/4 score (default: %(default)s)",
    )
    parser.add_argument(
        "--words",
        default=",".join(w.strip() for w in DEFAULT_PROBE_WORDS),
        help="comma-separated probe words for the neighbour lists, each tried with a leading space as a "
        "word inside text (only those that are one token are used) (default: %(default)s)",
    )
    parser.add_argument(
        "--embedding-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="effective embeddings of the N most frequent tokens only; memory is (layers + 1) x N x d floats "
        "per model (default: every token seen in training)",
    )
    parser.add_argument(
        "--split",
        choices=("types", "positions"),
        default="types",
        help="bit probes fitted on half the token types and scored on the other half (types, the test of "
        "whether a code is decoded), or on positions that may share types (default: %(default)s)",
    )
    parser.add_argument(
        "--mlp-probe",
        action="store_true",
        help="also fit a one-hidden-layer MLP probe per layer and code set (256 ReLU units, AdamW, seeded), with "
        "the same split and controls: it can read XORs of code bits (an affine model's canonical bits) that a "
        "linear probe cannot; it keeps the fit positions' states in memory (default: linear probes only)",
    )
    parser.add_argument(
        "--frequency-bands",
        action="store_true",
        help="instead of the probes: checkpoint − reference on the validation split, per frequency band of the "
        "input and of the target token (five bands of equal training-token mass), with a document-bootstrap "
        "interval, into --out (default CHECKPOINT/frequency-bands); needs --reference (a sweep's report has the "
        "same split paired over seeds) (default: the probes)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=8, help="windows per forward pass (default: %(default)s)"
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device, or auto for cuda when available (default: %(default)s)"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checkpoint's sha256 digests and finite-weights check (faster; printed when used)",
    )
    parser.set_defaults(func=run)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def run_frequency_bands(args: argparse.Namespace, out: str) -> int:
    if args.reference is None:
        raise ValueError("--frequency-bands compares two models: name the other one with --reference")
    frequency_band_analysis(
        args.checkpoint,
        args.reference,
        data=args.data,
        out=out,
        device=args.device,
        batch_size=args.batch_size,
        log=print,
    )
    print(f"frequency bands in {Path(out) / BANDS_MD}")
    return 0


def probe_words(text: str) -> list[str]:
    """``the,king`` → [" the", " king"]: words as they appear inside text to a byte-level BPE."""
    return [f" {word.strip()}" for word in text.split(",") if word.strip()]


def run(args: argparse.Namespace) -> int:
    if args.frequency_bands:  # its own directory: the probes' is replaced whole and refuses other files
        return run_frequency_bands(args, args.out or str(Path(args.checkpoint) / "frequency-bands"))
    out = args.out if args.out is not None else str(Path(args.checkpoint) / "analysis")
    spec = AnalyzeSpec(
        args.checkpoint,
        reference=args.reference,
        data=args.data,
        out=out,
        tokenizer=args.tokenizer,
        positions=args.positions,
        words=probe_words(args.words),
        embedding_tokens=args.embedding_tokens,
        device=args.device,
        batch_size=args.batch_size,
        split=args.split,
        verify=not args.no_verify,
        mlp_probe=args.mlp_probe,
    )
    result = run_analysis(spec, log=print)
    for key, kind in (("probes", "linear"), ("mlp_probes", "MLP")):
        for name, code_set in result.get(key, {}).get("code_sets", {}).items():
            accuracies = ", ".join(f"{100 * a:.1f}%" for a in code_set["mean_accuracy"])
            selectivity = code_set.get("selectivity")
            extra = (
                "; selectivity vs the untrained model: " + ", ".join(f"{100 * v:+.1f}" for v in selectivity)
                if selectivity
                else ""
            )
            print(f"{name} bits, mean {kind} probe accuracy per layer: {accuracies}{extra}")
    print(f"analysis.md, analysis.json and figures/ in {result['out']}")
    return 0
