"""The per-GPU memory plan of a recipe over launch shapes, as the markdown table of docs/distributed.md
("Memory plan"): `python benchmarks/memory_table.py [--config configs/paper-1.7b.yaml]`. Each row is one
`tablefree memory` plan (train/memory_plan.py: a fake-tensor trace of the real step), judged against 80 GB
and 141 GB devices (80·10^9 and 141·10^9 bytes, 90% usable)."""

from __future__ import annotations

import argparse

from tablefree.train.memory_plan import judge, launch_shape, plan_memory
from tablefree.train.recipe import load_train_config

GIB = 2**30
DEVICES = (80 * 10**9, 141 * 10**9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/paper-1.7b.yaml")
    parser.add_argument("--gpus", default="8,1", help="comma-separated GPU counts (FSDP2)")
    parser.add_argument("--micro-batches", default="4,8,16")
    args = parser.parse_args()
    print(
        "| GPUs (FSDP2) | micro-batch | act. ckpt | peak GiB | params + grads + Adam | activations | "
        "logits and loss | transient | 80 GB | 141 GB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for gpus in (int(g) for g in args.gpus.split(",")):
        for checkpointing in (False, True):
            for micro_batch in (int(m) for m in args.micro_batches.split(",")):
                overrides = [
                    f"micro_batch={micro_batch}",
                    f"activation_checkpointing={str(checkpointing).lower()}",
                    "parallel=fsdp",
                ]
                config = load_train_config(args.config, overrides)
                model_config = config.model.build()
                estimate = plan_memory(
                    model_config,
                    config,
                    launch_shape(config, model_config, gpus=gpus, precision="bf16"),
                    None,
                ).estimate
                state = estimate.parameters + estimate.gradients + estimate.optimizer_state
                verdicts = ["fits" if judge(estimate, d).fits else "**no**" for d in DEVICES]
                cells = [
                    gpus,
                    micro_batch,
                    "on" if checkpointing else "off",
                    estimate.peak_bytes / GIB,
                    state / GIB,
                    estimate.activations / GIB,
                    estimate.logits_loss / GIB,
                    estimate.transient / GIB,
                ]
                print(
                    "| "
                    + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells)
                    + " | "
                    + " | ".join(verdicts)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
