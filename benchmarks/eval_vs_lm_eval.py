"""End to end: ``tablefree eval`` (``run_eval``) against lm-evaluation-harness's ``hf`` backend on the exported model.

Same model (a preset, randomly initialised: speed only), same examples (the first ``--limit`` documents of each
task, read by lm-eval through ``write_local_tasks``, i.e. lm-eval's official task configs), same machine, same run.
Each side is timed from the call to the results, so tokenization, request building and model loading count, as
they do for a user; the two alternate for ``--repeats`` rounds (paired, since other jobs share the CPUs) and the
best round of each is reported. The log-likelihoods are checked to agree. The engine-only comparison (the same
token requests through both scorers) is the ``lm-eval-hf`` column of ``benchmarks/eval_speed.py``.

    python benchmarks/eval_vs_lm_eval.py --preset small --tasks hellaswag --limit 100 --threads 2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval
import torch
from lm_eval.tasks import TaskManager

from tablefree import build_model, preset
from tablefree.data.corpus import Corpus
from tablefree.data.tokenizer import tokenizer_hash, train_tokenizer_from_texts
from tablefree.evaluate import run_eval
from tablefree.evaluate.lm_eval_adapter import write_local_tasks
from tablefree.export import export_hf
from tablefree.model_files import save_model

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--interface", default="canonical")
    parser.add_argument("--tasks", default="hellaswag", help="comma-separated tablefree task names")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-data", default=str(SHARED / "eval"))
    parser.add_argument("--corpus", default=str(SHARED / "corpus" / "gutenberg-mix" / "literature"))
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = args.tasks.split(",")
    root = Path(tempfile.mkdtemp(prefix="tablefree-eval-vs-lm-eval-"))

    config = preset(args.preset, interface=args.interface)
    texts = [text for _, text in zip(range(6), Corpus(args.corpus, gutenberg=True).documents(), strict=False)]
    tokenizer = train_tokenizer_from_texts(texts, config.vocab_size, root / "tokenizer.json")
    model = build_model(config, seed=0)
    meta = {"step": 0, "tokenizer_hash": tokenizer_hash(tokenizer)}
    save_model(root / "checkpoint", model, meta=meta, tokenizer_path=root / "tokenizer.json")
    export_hf(root / "checkpoint", root / "hf")
    names = write_local_tasks(root / "tasks", args.eval_data, tasks, limit=args.limit)
    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)

    def ours() -> dict:
        examples = root / "examples.jsonl"
        run_eval(
            root / "checkpoint",
            tasks,
            data_dir=args.eval_data,
            limit=args.limit,
            batch_size=args.batch_size,
            examples_out=examples,
            bootstrap_iters=0,
        )
        rows = [json.loads(line) for line in examples.read_text().splitlines()]
        return {(r["task"], r["doc_id"]): r["loglikelihoods"] for r in rows}

    def theirs() -> dict:
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(root / "hf"), "dtype": "float32"},
            tasks=list(names.values()),
            task_manager=manager,
            batch_size=args.batch_size,
            device="cpu",
            limit=args.limit,
            log_samples=True,
            bootstrap_iters=0,
        )
        return {
            (task, s["doc_id"]): [r[0] for r in s["filtered_resps"]]
            for task, name in names.items()
            for s in results["samples"][name]
        }

    theirs()  # untimed warm-up: builds lm-eval's dataset cache
    seconds: dict[str, list[float]] = {"tablefree eval": [], "lm-eval hf": []}
    scores: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label, run in (("tablefree eval", ours), ("lm-eval hf", theirs)):
            start = time.perf_counter()
            scores[label] = run()
            seconds[label].append(time.perf_counter() - start)
    reference, other = scores["tablefree eval"], scores["lm-eval hf"]
    diff = max(abs(a - b) for key in reference for a, b in zip(reference[key], other[key], strict=True))
    documents = len(reference)
    figures = {
        "preset": args.preset,
        "interface": args.interface,
        "tasks": tasks,
        "documents": documents,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "max_abs_loglikelihood_diff": diff,
    }
    for label, values in seconds.items():
        best = min(values)
        figures[label] = {"seconds": values, "best_s": best, "examples_per_s": documents / best}
        print(
            f"{label:>15}: {documents} documents, best of {len(values)}: {best:.1f} s = {documents / best:.2f} ex/s"
        )
    ratio = min(seconds["lm-eval hf"]) / min(seconds["tablefree eval"])
    figures["speedup"] = ratio
    print(f"tablefree eval is {ratio:.2f}x faster end to end; max |Δ loglik| {diff:.1e}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
