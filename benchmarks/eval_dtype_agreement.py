"""How many predictions bf16 evaluation changes against fp32, and whether they were near-ties.

Scores one checkpoint (a trained one: ``tablefree demo`` or ``tablefree train --config configs/tiny.yaml``
leave some under ``runs/``) on the real HellaSwag, PIQA and LAMBADA files with ``run_eval(dtype="fp32")`` and
``run_eval(dtype="bf16")``, then compares per document: the chosen answer (acc and acc_norm for multiple
choice, the greedy flag for LAMBADA), the fp32 margin of every flipped choice, the largest |Δ log-likelihood|,
and the time of each pass (one pass each, fp32 first: a rough figure; compare speed with the benchmarks that
alternate rounds).

    python benchmarks/eval_dtype_agreement.py runs/tiny-canonical --eval-data ../shared/data/eval --limit 300
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from tablefree.evaluate import EvalSpec, run_eval

REPO = Path(__file__).resolve().parents[1]
TASKS = ["hellaswag", "piqa", "lambada"]


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def run(checkpoint: str, eval_data: str, limit: int, dtype: str, out: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    run_eval(
        EvalSpec(
            checkpoint,
            TASKS,
            data_dir=eval_data,
            limit=limit,
            dtype=dtype,
            examples_out=out,
            bootstrap_iters=0,
        )
    )
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {(r["task"], r["doc_id"]): r for r in records}, seconds


def compare(fp32: dict, bf16: dict) -> dict:
    per_task: dict[str, dict] = {}
    for key, a in fp32.items():
        b = bf16[key]
        task = per_task.setdefault(
            key[0], {"documents": 0, "flips": 0, "flips_norm": 0, "flip_margins": [], "max_abs_delta": 0.0}
        )
        task["flips_norm"] += int(a.get("pred_norm") != b.get("pred_norm"))
        task["documents"] += 1
        la, lb = a["loglikelihoods"], b["loglikelihoods"]
        task["max_abs_delta"] = max(task["max_abs_delta"], *(abs(x - y) for x, y in zip(la, lb, strict=True)))
        if len(la) == 1:  # LAMBADA: the greedy flag is the prediction
            flipped = a.get("greedy") != b.get("greedy")
            margin = None
        else:
            i, j = argmax(la), argmax(lb)
            flipped, margin = i != j, abs(la[i] - la[j])
        if flipped:
            task["flips"] += 1
            task["flip_margins"].append(margin)
    return per_task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint")
    parser.add_argument("--eval-data", default=str(REPO.parent / "shared" / "data" / "eval"))
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        fp32, fp32_s = run(args.checkpoint, args.eval_data, args.limit, "fp32", Path(tmp) / "fp32.jsonl")
        bf16, bf16_s = run(args.checkpoint, args.eval_data, args.limit, "bf16", Path(tmp) / "bf16.jsonl")
    per_task = compare(fp32, bf16)
    print(
        f"fp32 {fp32_s:.1f} s, bf16 {bf16_s:.1f} s ({fp32_s / bf16_s:.2f}x), {torch.get_num_threads()} threads"
    )
    for name, t in per_task.items():
        margins = [m for m in t["flip_margins"] if m is not None]
        worst = f", largest fp32 margin of a flip {max(margins):.3f} nats" if margins else ""
        print(
            f"{name:<10} {t['flips']}/{t['documents']} predictions differ ({t['flips_norm']} by acc_norm); "
            f"max |Δ loglik| "
            f"{t['max_abs_delta']:.3f}{worst}"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"fp32_s": fp32_s, "bf16_s": bf16_s, "tasks": per_task}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
