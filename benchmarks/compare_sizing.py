"""How long will a `tablefree compare` sweep take here? Time a short piece of it and extrapolate.

Trains one run of the sweep's recipe for a few optimizer steps, evaluates it on the first N documents of each
benchmark (and on validation windows), and scales each cost to the sweep: runs × (budget steps × per-step time +
documents × per-document time + validation windows × per-window time). Fixed costs (start-up, model loading) are
measured with a second, smaller evaluation and subtracted. Prints wall-clock and CPU-time figures: on a busy
machine, CPU time / cores is the better guess of the time on idle cores.

    python benchmarks/compare_sizing.py --config configs/compare-small.yaml --data-dir data/gutenberg-8k \
        --eval-data ../shared/data/eval --steps 6 --docs 100,300
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

from tablefree.compare import load_compare_config
from tablefree.config_parsing import from_dict
from tablefree.evaluate import EvalSpec, run_eval
from tablefree.sweep.plan import plan_runs
from tablefree.train import trainer
from tablefree.train.recipe import TrainConfig, plan


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--data-dir", default=None, help="a prepared dataset (default: the config's)")
    parser.add_argument("--eval-data", default=None)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps to time")
    parser.add_argument(
        "--docs", default="100,300", help="two benchmark document counts (fixed cost + slope)"
    )
    parser.add_argument("--val-windows", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    overrides = [f"dataset.dir={args.data_dir}"] if args.data_dir else []
    if args.eval_data:
        overrides.append(f"eval.data_dir={args.eval_data}")
    config = load_compare_config(args.config, overrides=overrides)
    runs = plan_runs(config)
    recipe = dict(
        runs[0].recipe, budget=f"{args.steps} steps", val_every=0, checkpoint_every=0, val_batches=1
    )
    recipe["schedule"] = {**recipe.get("schedule", {}), "warmup_steps": 1}
    small, large = (int(n) for n in args.docs.split(","))
    benchmarks = [t for t in config.eval.tasks if t != "validation"]
    cores = os.cpu_count() or 1

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        train_config = from_dict(TrainConfig, recipe, where="sizing recipe")
        summary, _, train_cpu = timed(lambda: trainer.train(train_config, run_dir))
        step_wall = summary["train_time_s"] / args.steps
        step_cpu = train_cpu / args.steps  # includes start-up: a slight overestimate per step
        eval_costs = {}
        for task in benchmarks:
            _, wall_a, cpu_a = timed(
                lambda t=task: run_eval(EvalSpec(run_dir, [t], data_dir=config.eval.data_dir, limit=small))
            )
            _, wall_b, cpu_b = timed(
                lambda t=task: run_eval(EvalSpec(run_dir, [t], data_dir=config.eval.data_dir, limit=large))
            )
            eval_costs[task] = {
                "wall_per_doc": (wall_b - wall_a) / (large - small),
                "cpu_per_doc": (cpu_b - cpu_a) / (large - small),
                "fixed_wall": wall_a - small * (wall_b - wall_a) / (large - small),
            }
        _, val_wall, val_cpu = timed(
            lambda: run_eval(
                EvalSpec(run_dir, ["validation"], limit=args.val_windows, val_data=recipe["data"]["dir"])
            )
        )

    from tablefree.data.loader import read_manifest
    from tablefree.evaluate import get_task, load_docs

    manifest = read_manifest(recipe["data"]["dir"])
    steps = plan(
        from_dict(TrainConfig, runs[0].recipe), train_config.model.build(int(manifest["vocab_size"]))
    ).total_steps
    docs = {t: len(load_docs(get_task(t), config.eval.data_dir, config.eval.limit)) for t in benchmarks}
    full_docs = {t: len(load_docs(get_task(t), config.eval.data_dir)) for t in benchmarks}
    val_windows = config.eval.val_limit or math.inf

    def per_run(kind: str, docs_per_task: dict[str, int]) -> float:
        train = steps * (step_wall if kind == "wall" else step_cpu / cores)
        evaluate = sum(
            n * (eval_costs[t]["wall_per_doc"] if kind == "wall" else eval_costs[t]["cpu_per_doc"] / cores)
            + max(0.0, eval_costs[t]["fixed_wall"])
            for t, n in docs_per_task.items()
        )
        windows = min(val_windows, 10_000)
        validation = windows / args.val_windows * (val_wall if kind == "wall" else val_cpu / cores)
        return train + evaluate + validation

    result = {
        "config": args.config,
        "runs": len(runs),
        "steps_per_run": steps,
        "timed_steps": args.steps,
        "step_wall_s": step_wall,
        "step_cpu_s": step_cpu,
        "train_tokens_per_s_wall": summary["tokens_per_s"],
        "eval_costs": eval_costs,
        "benchmark_docs_per_run": docs,
        "sweep_minutes_wall_extrapolated": len(runs) * per_run("wall", docs) / 60,
        "sweep_minutes_cpu_over_cores": len(runs) * per_run("cpu", docs) / 60,
        "sweep_minutes_full_sets_cpu_over_cores": len(runs) * per_run("cpu", full_docs) / 60,
        "cores": cores,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
