"""GPU training benchmark (run by benchmarks/gpu.sh): the bf16 matmul ceiling of this device, then a few
training steps of ``paper-1.7b`` (bf16, torch.compile, FSDP2 on one GPU) for the ``learned`` and ``canonical``
interfaces on synthetic data. Reports tokens/s, MFU against both the measured ceiling and the datasheet peak,
and peak memory. Each interface trains in its own process, through the real ``tablefree train`` command.

The results JSON is rewritten (atomically) after each run, so a later failure or a lost machine keeps the
figures measured so far; a run that fails is recorded with its error and the next one still runs. The runs
write no checkpoint (``checkpoint_format=none``: at 1.7B one is about 21 GB and over a minute to write), and
each run's directory is deleted as soon as its figures are read.

    python3 benchmarks/train_gpu.py --out gpu-bench/train_paper-1.7b.json
    python3 benchmarks/train_gpu.py --device cpu --preset tiny --micro-batch 2 --seq-len 128 --steps 3 \\
        --warmup 1 --ceiling-size 512 --out /tmp/train_tiny.json        # the dry run of benchmarks/gpu.sh
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from train_throughput import make_synthetic_dataset  # benchmarks/ is on sys.path when run as a script


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_ceiling_tflops(device: str, size: int = 8192, iterations: int = 50) -> float:
    """Achieved bf16 TFLOP/s of a large square matmul (the practical ceiling MFU is measured against)."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        a @ b
    synchronize(device)
    return 2 * size**3 * iterations / (time.perf_counter() - start) / 1e12


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def train_command(args: argparse.Namespace, interface: str, run_dir: Path, data_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "tablefree.cli", "train", "--run-dir", str(run_dir),
        f"model.preset={args.preset}", f"model.interface.name={interface}", f"data.dir={data_dir}",
        f"budget={args.steps} steps", f"batch_tokens={args.micro_batch * args.seq_len}",
        f"micro_batch={args.micro_batch}", f"seq_len={args.seq_len}", "precision=bf16", f"device={args.device}",
        f"compile={'false' if args.no_compile else 'true'}", f"parallel={args.parallel}",
        f"log_every={args.log_every}", "val_batches=2", "checkpoint_format=none", "schedule.warmup_steps=1",
    ]  # fmt: skip


def run_figures(run_dir: Path, warmup: int, log_every: int, ceiling: float) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # each record's rate covers the log_every steps before it; those that include a warm-up step are left out
    steady_records = [r for r in records if "train_loss" in r and r["step"] - log_every >= warmup]
    steady = [r["tokens_per_s"] for r in steady_records]
    if not steady:
        raise ValueError(f"{run_dir}: no log record after the {warmup} warm-up steps (log_every {log_every})")
    tokens_per_s = statistics.median(steady)
    achieved_tflops = summary["flops_per_token"] * tokens_per_s / 1e12
    # the trainer's own MFU is against its measured ceiling; the datasheet figure is reported beside it
    datasheet = summary.get("datasheet_bf16_flops_per_device") or float("nan")
    return {
        "tokens_per_s_median": tokens_per_s,
        # the last record can cover fewer than log_every steps (a budget that is not a multiple)
        "steps_measured": steady_records[-1]["step"] - steady_records[0]["step"] + log_every,
        "flops_per_token": summary["flops_per_token"],
        "achieved_tflops": achieved_tflops,
        "mfu_vs_matmul_ceiling": achieved_tflops / ceiling,
        "mfu_vs_datasheet": achieved_tflops * 1e12 / datasheet,
        "peak_memory_gb": summary["peak_memory_gb"],
        "final_train_loss": summary["final_train_loss"],
        "params": summary["params"],
    }


def print_table(results: dict[str, Any]) -> None:
    print(
        f"\n{'interface':<10} {'tok/s':>9} {'TFLOP/s':>8} {'MFU(ceil)':>10} {'MFU(sheet)':>11} {'peak GB':>8}"
    )
    for interface, r in results["runs"].items():
        if "error" in r:
            print(f"{interface:<10} FAILED: {r['error']}")
            continue
        print(
            f"{interface:<10} {r['tokens_per_s_median']:>9.0f} {r['achieved_tflops']:>8.1f} "
            f"{100 * r['mfu_vs_matmul_ceiling']:>9.1f}% {100 * r['mfu_vs_datasheet']:>10.1f}% "
            f"{r['peak_memory_gb']:>8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="paper-1.7b")
    parser.add_argument("--interfaces", nargs="+", default=["learned", "canonical"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12, help="steps per interface (the first few compile)")
    parser.add_argument("--warmup", type=int, default=4, help="steps excluded from the figures")
    parser.add_argument(
        "--log-every", type=int, default=4, help="steps per host read of the loss (and per rate measured)"
    )
    parser.add_argument("--parallel", default="fsdp", choices=["fsdp", "ddp"])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--ceiling-size", type=int, default=8192, help="matmul size for the bf16 ceiling")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.warmup + args.log_every > args.steps:
        parser.error(
            f"--steps ({args.steps}) must leave at least one log interval of --log-every ({args.log_every}) "
            f"steps after --warmup ({args.warmup})"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (use --device cpu for a dry run)")

    from tablefree.fileio import write_json_atomic
    from tablefree.model_config import preset

    vocab = preset(args.preset).vocab_size
    ceiling = matmul_ceiling_tflops(args.device, args.ceiling_size)
    print(f"{device_name(args.device)}: bf16 matmul ceiling {ceiling:.1f} TFLOP/s", flush=True)
    results: dict[str, Any] = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "matmul_ceiling_tflops": ceiling,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "runs": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)
    with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=".train_gpu.") as tmp:
        tokens = (args.steps + 4) * args.micro_batch * (args.seq_len + 1)
        data_dir = make_synthetic_dataset(Path(tmp) / "data", vocab, tokens, val_tokens=tokens // 4)
        for interface in args.interfaces:
            run_dir = Path(tmp) / interface
            command = train_command(args, interface, run_dir, data_dir)
            print(f"--- {interface}: {' '.join(command[3:])}", flush=True)
            finished = subprocess.run(command, check=False)
            try:
                if finished.returncode != 0:
                    raise RuntimeError(f"tablefree train exited with status {finished.returncode}")
                results["runs"][interface] = run_figures(run_dir, args.warmup, args.log_every, ceiling)
            except (RuntimeError, OSError, ValueError, KeyError, statistics.StatisticsError) as error:
                results["runs"][interface] = {"error": f"{type(error).__name__}: {error}"}
            shutil.rmtree(run_dir, ignore_errors=True)  # its checkpoint would fill the disk
            write_json_atomic(args.out, results)
            print(json.dumps(results["runs"][interface], indent=2), flush=True)
    print_table(results)
    if any("error" in r for r in results["runs"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
