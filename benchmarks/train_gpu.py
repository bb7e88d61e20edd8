"""GPU training benchmark (run by benchmarks/gpu.sh): the bf16 matmul ceiling of this GPU, then a few training
steps of ``paper-1.7b`` (bf16, torch.compile, FSDP2 on one GPU) for the ``learned`` and ``canonical``
interfaces on synthetic data. Reports tokens/s, MFU against both the measured ceiling and the datasheet peak,
and peak memory. Each interface trains in its own process, through the real ``tablefree train`` command.

    python benchmarks/train_gpu.py --out gpu-bench/train_paper-1.7b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from train_throughput import make_synthetic_dataset  # benchmarks/ is on sys.path when run as a script


def matmul_ceiling_tflops(size: int = 8192, iterations: int = 50) -> float:
    """Achieved bf16 TFLOP/s of a large square matmul (the practical ceiling MFU is measured against)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    return 2 * size**3 * iterations / seconds / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="paper-1.7b")
    parser.add_argument("--interfaces", nargs="+", default=["learned", "canonical"])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12, help="steps per interface (the first few compile)")
    parser.add_argument("--warmup", type=int, default=4, help="steps excluded from the figures")
    parser.add_argument("--parallel", default="fsdp", choices=["fsdp", "ddp"])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from tablefree.config import preset

    vocab = preset(args.preset).vocab_size
    ceiling = matmul_ceiling_tflops()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul ceiling {ceiling:.0f} TFLOP/s", flush=True)
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "matmul_ceiling_tflops": ceiling,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tokens = (args.steps + 4) * args.micro_batch * (args.seq_len + 1)
        data_dir = make_synthetic_dataset(Path(tmp) / "data", vocab, tokens, val_tokens=tokens // 10)
        for interface in args.interfaces:
            run_dir = Path(tmp) / interface
            command = [
                sys.executable, "-m", "tablefree.cli", "train", "--run-dir", str(run_dir),
                f"model.preset={args.preset}", f"model.interface.name={interface}", f"data.dir={data_dir}",
                f"budget={args.steps} steps", f"batch_tokens={args.micro_batch * args.seq_len}",
                f"micro_batch={args.micro_batch}", f"seq_len={args.seq_len}", "precision=bf16", "device=cuda",
                f"compile={'false' if args.no_compile else 'true'}", f"parallel={args.parallel}",
                "log_every=1", "val_batches=2", "keep_last=1", "schedule.warmup_steps=2",
            ]  # fmt: skip
            print(f"--- {interface}: {' '.join(command[3:])}", flush=True)
            subprocess.run(command, check=True)
            summary = json.loads((run_dir / "summary.json").read_text())
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            steady = [r["tokens_per_s"] for r in records if "train_loss" in r][args.warmup :]
            tokens_per_s = statistics.median(steady)
            achieved_tflops = summary["flops_per_token"] * tokens_per_s / 1e12
            results["runs"][interface] = {
                "tokens_per_s_median": tokens_per_s,
                "flops_per_token": summary["flops_per_token"],
                "achieved_tflops": achieved_tflops,
                "mfu_vs_matmul_ceiling": achieved_tflops / ceiling,
                "mfu_vs_datasheet": achieved_tflops * 1e12 / summary["peak_flops_per_device"],
                "peak_memory_gb": summary["peak_memory_gb"],
                "final_train_loss": summary["final_train_loss"],
                "params": summary["params"],
            }
            print(json.dumps(results["runs"][interface], indent=2), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(
        f"\n{'interface':<10} {'tok/s':>9} {'TFLOP/s':>8} {'MFU(ceil)':>10} {'MFU(sheet)':>11} {'peak GB':>8}"
    )
    for interface, r in results["runs"].items():
        print(
            f"{interface:<10} {r['tokens_per_s_median']:>9.0f} {r['achieved_tflops']:>8.1f} "
            f"{100 * r['mfu_vs_matmul_ceiling']:>9.1f}% {100 * r['mfu_vs_datasheet']:>10.1f}% "
            f"{r['peak_memory_gb']:>8.1f}"
        )


if __name__ == "__main__":
    main()
