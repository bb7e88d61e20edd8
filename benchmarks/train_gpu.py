"""GPU training benchmark (run by benchmarks/gpu.sh): a few training steps of ``paper-1.7b`` (bf16, torch.compile,
FSDP2 on one GPU) for the ``learned`` and ``canonical`` interfaces on synthetic data, each in its own process
through the real ``tablefree train`` command. Reports tokens/s, MFU against the measured bf16 matmul ceiling and
against the datasheet peak, peak memory, and which optimizer path and threading each run took.

One ceiling for every MFU: it is read (or measured) once here by ``tablefree.hardware.peak_flops`` and given
to every run as ``peak_flops``, so the runs and this file report against the same figure.

A run that fails falls back: compiled FSDP2, then eager FSDP2, then eager DDP (an interface starts at the
attempt that last worked). ``--time-limit`` shares the seconds left among the interfaces still to run; a run
out of its share gets SIGTERM (the trainer stops after its current step and writes its summary) and its
figures are those of the steps it finished. The results JSON (strict: null with a reason, never NaN) is
rewritten atomically after each run, so a later failure or a lost machine keeps the figures measured so far.
The runs write no checkpoint (``checkpoint_format=none``: at 1.7B one is about 21 GB and over a minute to
write), and each run's directory is deleted as soon as its figures are read.

    python3 benchmarks/train_gpu.py --out gpu-bench/train_paper-1.7b.json --time-limit 270
    python3 benchmarks/train_gpu.py --device cpu --preset tiny --micro-batch 2 --seq-len 128 --steps 3 \\
        --warmup 1 --log-every 1 --out /tmp/train_tiny.json        # the dry run of benchmarks/gpu.sh
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from train_throughput import make_synthetic_dataset  # benchmarks/ is on sys.path when run as a script

# (parallel, compile) tried in this order until one run succeeds
ATTEMPTS = (("fsdp", True), ("fsdp", False), ("ddp", False))
STOP_GRACE_S = 20  # after SIGTERM, how long a run may take to finish its step and write its summary
# header lines of `tablefree train` kept with each run's figures
HEADER_FIELDS = ("optimizer", "precision", "compile", "threads")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def train_command(
    args: argparse.Namespace,
    interface: str,
    run_dir: Path,
    data_dir: Path,
    attempt: tuple[str, bool],
    ceiling: float,
) -> list[str]:
    parallel, compiled = attempt
    return [
        sys.executable, "-m", "tablefree.cli", "train", "--run-dir", str(run_dir),
        f"model.preset={args.preset}", f"model.interface.name={interface}", f"data.dir={data_dir}",
        f"budget={args.steps} steps", f"batch_tokens={args.micro_batch * args.seq_len}",
        f"micro_batch={args.micro_batch}", f"seq_len={args.seq_len}", "precision=bf16", f"device={args.device}",
        f"compile={'true' if compiled else 'false'}", f"parallel={parallel}", f"peak_flops={ceiling}",
        f"log_every={args.log_every}", "val_batches=2", "checkpoint_format=none", "schedule.warmup_steps=1",
    ]  # fmt: skip


def run_figures(run_dir: Path, warmup: int, log_every: int, ceiling: float) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # each record's rate covers the log_every steps before it; those that include a warm-up step are left out
    steady_records = [r for r in records if "train_loss" in r and r["step"] - log_every >= warmup]
    steady = [r["tokens_per_s"] for r in steady_records]
    if not steady:
        raise ValueError(
            f"{run_dir}: no log record after the {warmup} warm-up steps (log_every {log_every}; the run stopped "
            f"at step {summary['step']}: {summary['stop_reason']})"
        )
    tokens_per_s = statistics.median(steady)
    achieved_tflops = summary["flops_per_token"] * tokens_per_s / 1e12
    datasheet = summary.get("datasheet_bf16_flops_per_device")
    figures = {
        "tokens_per_s_median": tokens_per_s,
        # the last record can cover fewer than log_every steps (a budget that is not a multiple)
        "steps_measured": steady_records[-1]["step"] - steady_records[0]["step"] + log_every,
        "completed": summary["completed"],
        "stop_reason": summary["stop_reason"],
        "flops_per_token": summary["flops_per_token"],
        "achieved_tflops": achieved_tflops,
        "mfu_vs_matmul_ceiling": achieved_tflops * 1e12 / ceiling,
        "trainer_peak_flops": summary["peak_flops_per_device"],  # the same ceiling, given to the run
        "mfu_vs_datasheet": achieved_tflops * 1e12 / datasheet if datasheet else None,
        "peak_memory_gb": summary["peak_memory_gb"],
        "final_train_loss": summary["final_train_loss"],
        "params": summary["params"],
    }
    if not datasheet:
        figures["mfu_vs_datasheet_reason"] = "no datasheet bf16 peak is known for this device"
    return figures


class Run:
    """One ``tablefree train`` process: its output goes to ours as it comes, and its last lines and header are
    kept; ``stop`` asks it to finish its step and write its summary (SIGTERM), then kills it."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.tail: collections.deque[str] = collections.deque(maxlen=15)
        self.header: dict[str, str] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            print(line, end="", flush=True)
            self.tail.append(line.rstrip())
            key, sep, value = line.strip().partition(": ")
            if sep and key in HEADER_FIELDS and key not in self.header:
                self.header[key] = value

    def wait(self, timeout: float | None) -> str | None:
        """The exit status, or "stopped" when it ran out of ``timeout`` seconds and was stopped."""
        try:
            self.process.wait(timeout=timeout)
            self.reader.join(timeout=5)
            return None
        except subprocess.TimeoutExpired:
            self.stop()
            return "stopped"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(timeout=5)


def print_table(results: dict[str, Any]) -> None:
    print(
        f"\n{'interface':<10} {'tok/s':>9} {'TFLOP/s':>8} {'MFU(ceil)':>10} {'MFU(sheet)':>11} {'peak GB':>8}"
    )
    for interface, r in results["runs"].items():
        if "error" in r:
            print(f"{interface:<10} FAILED: {r['error']}")
            continue
        sheet = (
            f"{100 * r['mfu_vs_datasheet']:>10.1f}%" if r["mfu_vs_datasheet"] is not None else f"{'-':>11}"
        )
        print(
            f"{interface:<10} {r['tokens_per_s_median']:>9.0f} {r['achieved_tflops']:>8.1f} "
            f"{100 * r['mfu_vs_matmul_ceiling']:>9.1f}% {sheet} {r['peak_memory_gb']:>8.1f}"
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
    parser.add_argument("--parallel", default="fsdp", choices=["fsdp", "ddp"], help="the first attempt's")
    parser.add_argument("--no-compile", action="store_true", help="no compiled attempt")
    parser.add_argument("--time-limit", type=float, help="seconds for all runs together (default: no limit)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.warmup + args.log_every > args.steps:
        parser.error(
            f"--steps ({args.steps}) must leave at least one log interval of --log-every ({args.log_every}) "
            f"steps after --warmup ({args.warmup})"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (use --device cpu for a dry run)")
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    stop = {"requested": False}

    def on_term(signum: int, frame: Any) -> None:  # gpu.sh's deadline: the run gets it too and stops itself
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)

    from tablefree import hardware
    from tablefree.fileio import write_json_atomic
    from tablefree.model_config import preset

    attempts = [a for a in ATTEMPTS if not (args.no_compile and a[1])]
    attempts = [a for a in attempts if a[0] == args.parallel] + [a for a in attempts if a[0] != args.parallel]
    vocab = preset(args.preset).vocab_size
    ceiling = hardware.peak_flops(
        torch.device(args.device), torch.bfloat16, progress=lambda message: print(message, flush=True)
    )
    print(f"{device_name(args.device)}: MFU against the bf16 matmul ceiling {ceiling.describe()}", flush=True)
    results: dict[str, Any] = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "matmul_ceiling_tflops": ceiling.tflops,
        "matmul_ceiling": {
            "source": ceiling.source,
            "under_load": hardware.under_load(ceiling),
            **ceiling.provenance,
        },
        "datasheet_bf16_tflops": (hardware.datasheet_bf16_flops(torch.device(args.device)) or 0) / 1e12
        or None,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "runs": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)
    with tempfile.TemporaryDirectory(prefix="train_gpu.") as tmp:
        tokens = (args.steps + 4) * args.micro_batch * (args.seq_len + 1)
        data_dir = make_synthetic_dataset(Path(tmp) / "data", vocab, tokens, val_tokens=tokens // 4)
        for index, interface in enumerate(args.interfaces):
            record: dict[str, Any] = {"attempts": []}
            results["runs"][interface] = record
            for attempt in list(attempts):
                if stop["requested"]:
                    record["error"] = "not run: the script was stopped (deadline)"
                    break
                share = None
                if deadline is not None:
                    share = (deadline - time.monotonic()) / (len(args.interfaces) - index) - STOP_GRACE_S
                    if share < 5:
                        record["error"] = "not run: no time left in --time-limit"
                        break
                run_dir = Path(tmp) / f"{interface}-{attempt[0]}-{'compiled' if attempt[1] else 'eager'}"
                command = train_command(args, interface, run_dir, data_dir, attempt, ceiling.flops)
                print(
                    f"--- {interface} ({attempt[0]}, compile {attempt[1]}): {' '.join(command[3:])}",
                    flush=True,
                )
                started = time.monotonic()
                run = Run(command)
                status = run.wait(share)
                if stop["requested"]:
                    run.stop()
                    status = "stopped"
                outcome = {
                    "parallel": attempt[0],
                    "compile": attempt[1],
                    "seconds": round(time.monotonic() - started, 1),
                }
                try:
                    if status is None and run.process.returncode != 0:
                        raise RuntimeError(f"tablefree train exited with status {run.process.returncode}")
                    record.update(run_figures(run_dir, args.warmup, args.log_every, ceiling.flops))
                    record.update(parallel=attempt[0], compile=attempt[1], header=run.header)
                    record.pop("error", None)
                    record["attempts"].append({**outcome, "status": status or "ok"})
                    attempts = attempts[attempts.index(attempt) :]  # the next interface starts here
                    break
                except (RuntimeError, OSError, ValueError, KeyError, statistics.StatisticsError) as error:
                    message = f"{type(error).__name__}: {error}"
                    record["error"] = message
                    record["attempts"].append(
                        {
                            **outcome,
                            "status": status or "failed",
                            "error": message,
                            "output_tail": list(run.tail),
                        }
                    )
                    if status == "stopped":
                        break  # out of time: a fallback would not have any
                finally:
                    shutil.rmtree(
                        run_dir, ignore_errors=True
                    )  # no checkpoint, but the metrics and compile caches
                    write_json_atomic(args.out, results)
            print(json.dumps({k: v for k, v in record.items() if k != "attempts"}, indent=2), flush=True)
    print_table(results)
    if any("error" in r for r in results["runs"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
