#!/usr/bin/env bash
# GPU benchmarks, one section per area. Run from the repository root on a GPU machine:
#   bash benchmarks/gpu.sh [OUT_DIR]
# Each section writes its figures as JSON under OUT_DIR; record them in docs/benchmarks.md (GPU section).
set -euo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # works without `pip install -e .`
OUT=${1:-${OUT:-gpu-bench}}  # an argument, else $OUT, else ./gpu-bench
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"

# --- evaluation: HellaSwag validation (10,042) throughput with a larger preset, packed engine vs naive loop ---
python benchmarks/eval_speed.py --device cuda --preset paper-1.7b --dtype bfloat16 --batch-size 64 \
    --sample 200 --block 50 --out "$OUT/eval_speed_paper-1.7b.json" | tee "$OUT/eval_speed_paper-1.7b.txt"

# --- training: bf16 matmul ceiling, then paper-1.7b for 12 steps (bf16, torch.compile, FSDP2 on one GPU),
# learned vs canonical: tokens/s, MFU (vs the measured ceiling and the datasheet), peak memory ---
python benchmarks/train_gpu.py --preset paper-1.7b --micro-batch 4 --seq-len 2048 --steps 12 --warmup 4 \
    --out "$OUT/train_paper-1.7b.json" 2>&1 | tee "$OUT/train_paper-1.7b.txt"
