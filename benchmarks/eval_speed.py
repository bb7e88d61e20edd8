"""HellaSwag validation throughput: the packed scoring engine against a naive one-request-at-a-time loop.

Both backends score the same token requests (lm-eval's encoding) with the same model; the script checks that
they give the same per-example predictions and log-likelihoods (to float rounding) on the documents both scored,
and reports examples/s and total time. The naive loop is lm-eval's computation without batching (one forward pass
per (context, ending) request); it is slow, so by default it runs on ``--naive-limit`` documents spread evenly over
the set (HellaSwag's ActivityNet and WikiHow parts differ a lot in length) and its full-set time is extrapolated
(printed as such). Other engineers' jobs share this machine's CPUs, so the comparison is *paired*: the sample is cut
into blocks and each block is scored by every backend in turn, so a change of load hits all backends alike. The
packed engine is also timed alone on the full set.

Backends are a registry (``BACKENDS``): a function (model, tokenizer, token requests, batch size) -> list of
(loglikelihood, greedy). The interop engineer can register an lm-eval ``hf`` backend column there.

    python benchmarks/eval_speed.py --preset small --threads 2 --naive-limit 300 --out eval_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree import build_model, preset
from tablefree.evaluate.engine import encode_pairs, loglikelihoods
from tablefree.evaluate.metrics import multiple_choice_scores
from tablefree.evaluate.task_record import build_requests
from tablefree.evaluate.tasks import TASKS, load_docs

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
Backend = Callable[[torch.nn.Module, Tokenizer, list, int], list[tuple[float, bool]]]


@torch.inference_mode()
def naive_loglikelihoods(model, tokenizer, requests, batch_size) -> list[tuple[float, bool]]:
    """One plain forward pass per request over ``(context + continuation)[-(L + 1):][:-1]`` (lm-eval, batch 1)."""
    max_len = model.config.max_seq_len
    device = next(model.parameters()).device
    out = []
    for context, continuation in requests:
        inputs = (context + continuation)[-(max_len + 1) :][:-1]
        logits = model(torch.tensor([inputs], device=device))[0, -len(continuation) :]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(continuation, device=device)
        out.append(
            (float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all()))
        )
    return out


def engine_loglikelihoods(model, tokenizer, requests, batch_size) -> list[tuple[float, bool]]:
    return loglikelihoods(model, requests, batch_size)


def lm_eval_hf_loglikelihoods(model, tokenizer, requests, batch_size) -> list[tuple[float, bool]]:
    """lm-eval's ``hf`` backend on the exported model (interop extra; see benchmarks/lm_eval_backend.py)."""
    from lm_eval_backend import lm_eval_hf_loglikelihoods as score

    return score(model, tokenizer, requests, batch_size)


BACKENDS: dict[str, Backend] = {
    "tablefree": engine_loglikelihoods,
    "naive": naive_loglikelihoods,
    "lm-eval-hf": lm_eval_hf_loglikelihoods,
}


def check_data(corpus: Path, eval_data: Path) -> list[Path]:
    """Fail before any work when the tokenizer text or the HellaSwag file is missing (a GPU machine gets only
    the working tree: ``benchmarks/gpu_data.py make`` generates both there). Returns the corpus files."""
    files = sorted(corpus.rglob("*.txt"))
    problems = [f"--corpus {corpus}: no .txt files"] if not files else []
    if not (eval_data / "hellaswag_val.jsonl").is_file():
        problems.append(f"--eval-data {eval_data}: no hellaswag_val.jsonl")
    if problems:
        raise SystemExit(
            "; ".join(problems) + " (generate both with: python3 benchmarks/gpu_data.py make --out DIR, then "
            "pass --corpus DIR/corpus --eval-data DIR/eval)"
        )
    return files


def train_benchmark_tokenizer(vocab_size: int, megabytes: float, files: list[Path]) -> Tokenizer:
    """A byte-level BPE on the first ``megabytes`` of the corpus files (speed only, not quality)."""
    texts, size = [], 0
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        texts.append(text)
        size += len(text)
        if size > megabytes * 1e6:
            break
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--interface", default="canonical")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--limit", type=int, default=None, help="HellaSwag documents (default: all 10,042)")
    parser.add_argument(
        "--sample", type=int, default=300, help="documents, evenly spread, for the paired comparison"
    )
    parser.add_argument("--block", type=int, default=25, help="documents per block of the paired comparison")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--backends", default="tablefree,naive", help=f"from {sorted(BACKENDS)}; first = reference"
    )
    parser.add_argument("--skip-full", action="store_true", help="skip the full-set run of the first backend")
    parser.add_argument("--eval-data", type=Path, default=SHARED / "eval", help="holds hellaswag_val.jsonl")
    parser.add_argument(
        "--corpus", type=Path, default=SHARED / "corpus" / "gutenberg-mix", help="*.txt for the tokenizer"
    )
    parser.add_argument("--tokenizer-mb", type=float, default=4.0)
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.backends.split(",")
    corpus_files = check_data(args.corpus, args.eval_data)

    start = time.perf_counter()
    config = preset(args.preset, interface=args.interface)
    tokenizer = train_benchmark_tokenizer(config.vocab_size, args.tokenizer_mb, corpus_files)
    model = build_model(config, seed=0, device=args.device).to(getattr(torch, args.dtype)).eval()
    print(f"tokenizer + model: {time.perf_counter() - start:.1f} s; {args.preset}, vocab {config.vocab_size}")

    task = TASKS["hellaswag"]
    docs = load_docs(task, args.eval_data, args.limit)
    start = time.perf_counter()
    doc_requests = [build_requests(task, doc.fields) for doc in docs]
    pairs = [pair for requests in doc_requests for pair in requests.pairs]
    token_requests = encode_pairs(tokenizer, pairs, tokenizer.token_to_id("<|endoftext|>"))
    tokenize_s = time.perf_counter() - start
    offsets = np.concatenate(([0], np.cumsum([len(r.pairs) for r in doc_requests])))
    unpacked = sum(min(len(c) + len(x) - 1, config.max_seq_len) for c, x in token_requests)
    print(
        f"{len(docs)} documents, {len(token_requests)} requests, {unpacked} input tokens unpacked; "
        f"tokenized in {tokenize_s:.1f} s"
    )

    def requests_of(indices: list[int]) -> list:
        return [token_requests[j] for i in indices for j in range(offsets[i], offsets[i + 1])]

    def predictions(scores: list, i: int) -> dict:
        return multiple_choice_scores([s[0] for s in scores], doc_requests[i].choices, doc_requests[i].gold)

    figures: dict = {
        "preset": args.preset,
        "interface": args.interface,
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "documents": len(docs),
        "requests": len(token_requests),
        "unpacked_input_tokens": unpacked,
        "batch_size": args.batch_size,
        "tokenize_s": tokenize_s,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }

    # 1. the reference backend alone on the full set
    full: dict[int, list] = {}
    if not args.skip_full:
        start, cpu_start = time.perf_counter(), time.process_time()
        scores = BACKENDS[names[0]](model, tokenizer, token_requests, args.batch_size)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        full = {i: scores[offsets[i] : offsets[i + 1]] for i in range(len(docs))}
        per_doc = [predictions(full[i], i) for i in range(len(docs))]
        figures["full"] = {
            "backend": names[0],
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,  # all threads; on a shared machine wall time overstates the cost
            "examples_per_s": len(docs) / seconds,
            "acc": float(np.mean([p["acc"] for p in per_doc])),
            "acc_norm": float(np.mean([p["acc_norm"] for p in per_doc])),
        }
        print(
            f"{names[0]} on all {len(docs)} documents: {seconds:.1f} s (CPU {cpu_seconds:.1f} s) = "
            f"{len(docs) / seconds:.2f} examples/s; "
            f"acc {figures['full']['acc']:.4f} acc_norm {figures['full']['acc_norm']:.4f}"
        )

    # 2. paired comparison on an evenly spread sample, block by block
    sample = sorted(
        set(np.linspace(0, len(docs) - 1, min(args.sample, len(docs))).round().astype(int).tolist())
    )
    seconds = dict.fromkeys(names, 0.0)
    cpu_seconds = dict.fromkeys(names, 0.0)
    scored: dict[str, dict[int, list]] = {name: {} for name in names}
    for name in names:  # untimed warm-up (lm-eval-hf exports the model and loads it here)
        BACKENDS[name](model, tokenizer, requests_of(sample[:1]), args.batch_size)
    for first in range(0, len(sample), args.block):
        block = sample[first : first + args.block]
        for name in names:
            start, cpu_start = time.perf_counter(), time.process_time()
            scores = BACKENDS[name](model, tokenizer, requests_of(block), args.batch_size)
            seconds[name] += time.perf_counter() - start
            cpu_seconds[name] += time.process_time() - cpu_start
            cursor = 0
            for i in block:
                n = int(offsets[i + 1] - offsets[i])
                scored[name][i] = scores[cursor : cursor + n]
                cursor += n
    figures["sample"] = {"documents": len(sample), "block": args.block, "backends": {}}
    for name in names:
        rate = len(sample) / seconds[name]
        figures["sample"]["backends"][name] = {
            "seconds": seconds[name],
            "cpu_seconds": cpu_seconds[name],
            "examples_per_s": rate,
            "full_set_seconds_extrapolated": len(docs) / rate,
            "slowdown_vs_reference": seconds[name] / seconds[names[0]],
        }
        print(
            f"paired sample, {name:>10}: {len(sample)} docs in {seconds[name]:.1f} s = {rate:.2f} examples/s "
            f"(full set ≈ {len(docs) / rate:.0f} s, extrapolated); {seconds[name] / seconds[names[0]]:.2f}x "
            f"the time of {names[0]}"
        )

    # 3. agreement: every backend against the reference (and the full-set run) on the sample
    references = {names[0]: scored[names[0]]} | ({"full": full} if full else {})
    for ref_name, ref in references.items():
        for name in names:
            if name == ref_name:
                continue
            a = [s for i in sample for s in ref[i]]
            b = [s for i in sample for s in scored[name][i]]
            max_diff = max(abs(x[0] - y[0]) for x, y in zip(a, b, strict=True))
            differing = sum(predictions(ref[i], i) != predictions(scored[name][i], i) for i in sample)
            same = differing == 0
            same_greedy = all(x[1] == y[1] for x, y in zip(a, b, strict=True))
            figures[f"agreement_{ref_name}_vs_{name}"] = {
                "documents": len(sample),
                "max_abs_loglikelihood_diff": max_diff,
                "same_predictions": same,
                "documents_with_different_predictions": differing,
                "same_greedy": same_greedy,
            }
            print(
                f"{ref_name} vs {name} on {len(sample)} docs: max |Δ loglik| {max_diff:.2e}, "
                f"identical predictions: {same}, identical greedy flags: {same_greedy}"
            )
            if not same and args.dtype == "float32":  # in bf16, rounding may flip near-ties
                raise SystemExit("backends disagree")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
