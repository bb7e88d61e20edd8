#!/usr/bin/env bash
# GPU benchmarks, one section per area. Run from the repository root on a GPU machine:
#   bash benchmarks/gpu.sh [OUT_DIR]
# Each section writes its figures as JSON under OUT_DIR; record them in docs/benchmarks.md (GPU section).
set -euo pipefail
OUT=${1:-gpu-bench}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"

# --- evaluation: HellaSwag validation (10,042) throughput with a larger preset, packed engine vs naive loop ---
python benchmarks/eval_speed.py --device cuda --preset paper-1.7b --dtype bfloat16 --batch-size 64 \
    --sample 200 --block 50 --out "$OUT/eval_speed_paper-1.7b.json" | tee "$OUT/eval_speed_paper-1.7b.txt"
