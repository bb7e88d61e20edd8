"""One JSON of every figure ``benchmarks/gpu.sh`` measured (run by it after each section): the sections' status,
time and share of the deadline, the machine (preflight), the paper-1.7b training figures, the short run's
summary, the evaluation figures and the rehearsal of configs/paper-1.7b.yaml, gathered from its scratch
directory into ``OUT/results.json``.

The file is strict JSON: a figure that is not a finite number becomes null, and its path is listed under
``nulls`` with the reason. Only the standard library and ``tablefree.fileio``: it must run when torch is broken.

    python benchmarks/gpu_results.py --scratch /tmp/gpu-sh.XXXX --out gpu-bench/results.json --deadline 540
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from tablefree.fileio import write_json_atomic

# results.json key -> the file a section leaves in the scratch directory
PARTS = {
    "machine": "preflight.json",
    "train": "train.json",
    "short_run": "short_summary.json",
    "eval": "eval.json",
    "rehearsal": "rehearse/rehearsal.json",
}


def strict(value: Any, path: str, nulls: list[dict[str, str]]) -> Any:
    """``value`` with every NaN or infinity replaced by None, each recorded in ``nulls`` with its path."""
    if isinstance(value, float) and not math.isfinite(value):
        nulls.append({"path": path, "reason": f"not a finite number ({value})"})
        return None
    if isinstance(value, dict):
        return {key: strict(item, f"{path}.{key}", nulls) for key, item in value.items()}
    if isinstance(value, list):
        return [strict(item, f"{path}[{index}]", nulls) for index, item in enumerate(value)]
    return value


def gather(scratch: Path, deadline: int, dry_run: bool, elapsed: int) -> dict[str, Any]:
    sections = []
    log = scratch / "sections.jsonl"
    if log.exists():
        sections = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    results: dict[str, Any] = {
        "script": {"deadline_s": deadline, "elapsed_s": elapsed, "dry_run": dry_run, "sections": sections}
    }
    for key, name in PARTS.items():
        path = scratch / name
        if not path.exists():
            results[key] = None
            continue
        try:
            results[key] = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            results[key] = {"error": f"{name} unreadable: {error}"}
    nulls: list[dict[str, str]] = []
    results = strict(results, "$", nulls)
    results["nulls"] = nulls
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=int, required=True)
    parser.add_argument("--dry-run", type=int, default=0)
    parser.add_argument("--elapsed", type=int, default=0, help="seconds since the script started")
    args = parser.parse_args()
    write_json_atomic(args.out, gather(args.scratch, args.deadline, bool(args.dry_run), args.elapsed))


if __name__ == "__main__":
    main()
