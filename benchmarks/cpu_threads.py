"""CPU training speed on a shared machine: `tiny` through `tablefree train`, with 0, 1 and 2 competing busy
processes (each a one-line Python loop), under OpenMP's default wait policy and under what the command line now
chooses (``OMP_WAIT_POLICY=PASSIVE``, ``tablefree.cpu_threads``).

Settings, alternated within each round so a change in the machine's other load touches all of them alike:

- ``default``: OMP_WAIT_POLICY unset and torch imported before the command line runs, so it cannot set the
  policy (what every run did before); the run's header says so.
- ``passive``: the ``tablefree`` entry point as users start it, with OMP_WAIT_POLICY unset: it sets PASSIVE.
- ``one-thread``: ``default`` with ``OMP_NUM_THREADS=1`` (for comparison).

Each run trains ``--steps`` steps of 16 × 256 tokens (fp32, eager, no checkpoint) on synthetic data; its rate is
the median of the metrics records after the first interval (which holds the first, slower step). The load
average is recorded before each run.

    python benchmarks/cpu_threads.py                               # 30 steps, competitors 0,1,2, one round
    python benchmarks/cpu_threads.py --steps 10 --settings default,passive --json /tmp/threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_throughput import make_synthetic_dataset  # benchmarks/ is on sys.path when run as a script

# how each setting starts `tablefree train`: (python -c program, extra environment)
DEFAULT_START = "import sys, torch; from tablefree.cli import main; sys.exit(main(sys.argv[1:]))"
ENTRY_POINT = "import sys; from tablefree.cli import main; sys.exit(main(sys.argv[1:]))"
SETTINGS = {
    "default": (DEFAULT_START, {}),
    "passive": (ENTRY_POINT, {}),
    "one-thread": (DEFAULT_START, {"OMP_NUM_THREADS": "1"}),
}
BUSY_LOOP = "while True: pass"
LOG_EVERY = 5


def train_once(setting: str, data_dir: Path, run_dir: Path, steps: int) -> dict:
    program, extra_env = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.pop("TABLEFREE_CHOSE_OMP_WAIT_POLICY", None)
    env.update(extra_env)
    command = [
        sys.executable, "-c", program, "train", "--run-dir", str(run_dir), "model.preset=tiny",
        f"data.dir={data_dir}", f"budget={steps} steps", "batch_tokens=4096", "micro_batch=16", "seq_len=256",
        "precision=fp32", "compile=false", "device=cpu", f"log_every={LOG_EVERY}", "val_batches=1",
        "checkpoint_format=none",
    ]  # fmt: skip
    load = os.getloadavg()[0]
    started = time.perf_counter()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"{setting}: tablefree train failed:\n{finished.stderr[-2000:]}")
    header = next(
        (line.strip() for line in finished.stdout.splitlines() if line.strip().startswith("threads:")), ""
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if "train_loss" in r and r["step"] > LOG_EVERY]
    return {
        "tokens_per_s": statistics.median(rates),
        "load_average_before": round(load, 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "header": header,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--competitors", default="0,1,2", help="comma-separated numbers of busy processes")
    parser.add_argument("--settings", default="default,passive", help=f"comma-separated, of {list(SETTINGS)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    settings = args.settings.split(",")
    if unknown := sorted(set(settings) - set(SETTINGS)):
        parser.error(f"--settings: unknown {unknown}; expected some of {list(SETTINGS)}")
    if args.steps < 2 * LOG_EVERY:
        parser.error(f"--steps must be at least {2 * LOG_EVERY} (the first {LOG_EVERY} are not counted)")
    competitors = [int(n) for n in args.competitors.split(",")]

    results: dict = {"cores": os.cpu_count(), "steps": args.steps, "runs": []}
    with tempfile.TemporaryDirectory(prefix="cpu_threads.") as tmp:
        data_dir = make_synthetic_dataset(Path(tmp) / "data", 4096, (args.steps + 2) * 4096 * 2)
        for count in competitors:
            busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
            try:
                for round_index in range(args.rounds):
                    for setting in settings:
                        run_dir = Path(tmp) / f"run-{count}-{round_index}-{setting}"
                        figures = train_once(setting, data_dir, run_dir, args.steps)
                        results["runs"].append({"competitors": count, "setting": setting, **figures})
                        print(
                            f"competitors {count}  {setting:<10}  {figures['tokens_per_s']:>7.0f} tok/s  "
                            f"(load average {figures['load_average_before']:.2f} before; {figures['header']})",
                            flush=True,
                        )
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
