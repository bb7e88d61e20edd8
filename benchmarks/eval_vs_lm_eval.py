"""End to end: ``tablefree eval`` (``run_eval``) against lm-evaluation-harness's ``hf`` backend on the exported model.

Same model (a preset, randomly initialised: speed only), same examples (the first ``--limit`` documents of each
task, read by lm-eval through ``write_local_tasks``, i.e. lm-eval's official task configs), same machine, same run.
Each side is timed from the call to the results, so tokenization, request building and model loading count, as
they do for a user. Ours runs at its defaults (``--batch-size``, ``dtype="auto"``); lm-eval runs at every
batch size in ``--lm-eval-batch-sizes`` and dtype in ``--lm-eval-dtypes``, and the speed-up is taken against its
best setting. All settings alternate for ``--repeats`` rounds (paired, since load changes hit every setting
alike) and the best round of each is reported, with each setting's largest log-likelihood difference from ours
(about 1e-4 in fp32; lm-eval's bf16 casts the weights, so there it is nats).

The script also counts the matrix-multiply work each side does (FLOPs of every ``nn.Linear`` call, from a
global forward hook in one untimed pass each: ours at its defaults, lm-eval at its best setting). When both run
near the machine's matmul ceiling, the ratio of that work bounds the speed-up. The engine-only comparison (the
same token requests through both scorers) is the ``lm-eval-hf`` column of ``benchmarks/eval_speed.py``.

    python benchmarks/eval_vs_lm_eval.py --preset tiny --tasks hellaswag,piqa,lambada --limit 300 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval
import torch
from lm_eval.tasks import TaskManager
from torch.nn.modules.module import register_module_forward_hook

from tablefree import build_model, preset
from tablefree.checkpoint.model_dir import save_model
from tablefree.cpu_memory import keep_freed_memory
from tablefree.data.corpus import Corpus
from tablefree.data.tokenizer import tokenizer_hash, train_tokenizer_from_texts
from tablefree.evaluate import EvalSpec, run_eval
from tablefree.evaluate.lm_eval_adapter import write_local_tasks
from tablefree.export import export_hf

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
    parser.add_argument("--batch-size", type=int, default=32, help="ours (rows of packed requests)")
    parser.add_argument("--lm-eval-batch-sizes", default="8,16,32,64", help="lm-eval settings to try")
    parser.add_argument("--lm-eval-dtypes", default="float32,bfloat16", help="lm-eval settings to try")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-data", default=str(SHARED / "eval"))
    parser.add_argument("--corpus", default=str(SHARED / "corpus" / "gutenberg-mix" / "literature"))
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # process-wide, and run_eval applies it on its first call: set it up front so every setting runs with it
    allocator = keep_freed_memory(torch.device("cpu"))
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
            EvalSpec(
                root / "checkpoint",
                tasks,
                data_dir=args.eval_data,
                limit=args.limit,
                batch_size=args.batch_size,
                examples_out=examples,
                bootstrap_iters=0,
            )
        )
        rows = [json.loads(line) for line in examples.read_text().splitlines()]
        return {(r["task"], r["doc_id"]): r["loglikelihoods"] for r in rows}

    def theirs(batch_size: int, dtype: str) -> dict:
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(root / "hf"), "dtype": dtype},
            tasks=list(names.values()),
            task_manager=manager,
            batch_size=batch_size,
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

    runs = {"tablefree eval": ours}
    for dtype in args.lm_eval_dtypes.split(","):
        for batch_size in map(int, args.lm_eval_batch_sizes.split(",")):
            runs[f"lm-eval hf {dtype} batch {batch_size}"] = functools.partial(theirs, batch_size, dtype)
    theirs(8, "float32")  # untimed warm-up: builds lm-eval's dataset cache
    seconds: dict[str, list[float]] = {label: [] for label in runs}
    scores: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label, run in runs.items():
            start = time.perf_counter()
            scores[label] = run()
            seconds[label].append(time.perf_counter() - start)
    best_theirs = min((label for label in runs if label.startswith("lm-eval")), key=lambda k: min(seconds[k]))
    reference = scores["tablefree eval"]
    documents = len(reference)
    figures = {
        "preset": args.preset,
        "interface": args.interface,
        "tasks": tasks,
        "documents": documents,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "lm_eval": lm_eval.__version__,
        "machine": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(),
        "allocator": allocator.reason,
        "settings": {},
    }
    for label, values in seconds.items():
        diff = max(
            abs(a - b) for key in reference for a, b in zip(reference[key], scores[label][key], strict=True)
        )
        best = min(values)
        figures["settings"][label] = {
            "seconds": values,
            "best_s": best,
            "examples_per_s": documents / best,
            "max_abs_loglikelihood_diff": diff,
        }
        print(
            f"{label:>32}: best of {len(values)}: {best:5.1f} s = {documents / best:7.2f} ex/s, max |Δ| {diff:.1e}"
        )
    ratio = min(seconds[best_theirs]) / min(seconds["tablefree eval"])
    ours_work, theirs_work = linear_flops(ours), linear_flops(runs[best_theirs])
    figures.update(
        lm_eval_best=best_theirs,
        speedup=ratio,
        linear_flops={
            "tablefree eval": ours_work,
            best_theirs: theirs_work,
            "ratio": theirs_work / ours_work,
        },
    )
    print(f"tablefree eval is {ratio:.2f}x faster end to end than {best_theirs} (its best setting)")
    print(
        f"matmul work: ours {ours_work / 1e12:.3f} TFLOP, lm-eval {theirs_work / 1e12:.3f} TFLOP "
        f"(ratio {theirs_work / ours_work:.2f}: the bound on the speed-up when both run at the matmul ceiling)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


def linear_flops(run: Callable[[], object]) -> int:
    """FLOPs of every ``nn.Linear`` call (2 x rows x in x out) during ``run()``: the weight matmuls, which are
    almost all of a forward pass's arithmetic (attention scores are not counted)."""
    total = 0

    def count(module: torch.nn.Module, inputs: tuple, _output: object) -> None:
        nonlocal total
        if isinstance(module, torch.nn.Linear):
            total += 2 * inputs[0].numel() * module.out_features

    handle = register_module_forward_hook(count)
    try:
        run()
    finally:
        handle.remove()
    return total


if __name__ == "__main__":
    main()
