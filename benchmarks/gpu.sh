#!/usr/bin/env bash
# GPU benchmarks in one command that keeps a deadline. Run from the repository root:
#   bash benchmarks/gpu.sh [--dry-run] [--deadline SECONDS] [--only SECTION,...] [OUT_DIR]
# OUT_DIR defaults to $OUT, else ./gpu-bench. It receives at most three small files:
#   results.json  every figure, and each section's status, time and share of the deadline (strict JSON)
#   gpu.log       everything the sections printed
#   short_run_metrics.jsonl  the metrics of the short training run (a loss curve)
#   rehearsal.json  the rehearsal of configs/paper-1.7b.yaml at its real shape (benchmarks/rehearse.sh); not
#                   a dry run, it is also copied to docs/results/gpu/ (RESULTS_DIR), to be committed
# Scratch data and run directories live in a temporary directory that is deleted at the end.
#
# Sections, in order: train (paper-1.7b, learned vs canonical: tokens/s, MFU against the measured bf16
# ceiling and against the datasheet, peak memory; compiled FSDP2, falling back to eager, then to DDP),
# data (generated corpus and evaluation set), rehearse (configs/paper-1.7b.yaml itself at micro-batch 8 × 2048 on
# one GPU, benchmarks/rehearse.sh --shape real --procs 1: trained, checkpointed (sharded), kill -9, resumed
# twice, its losses against the uninterrupted run's, exported, evaluated, generated from; the V = 49,152
# tokenizer is trained on the generated corpus with random filler words (--fill-vocab), which alone is too
# small for that many tokens), short (a smaller preset trained for a loss curve), eval (the packed evaluation engine
# against the naive loop). `--only rehearse` gives the rehearsal the whole deadline. The deadline (default 540 s) covers everything:
# each section gets a share of the time left, by weight, and is stopped with SIGTERM (then SIGKILL after a
# grace period) when its share runs out; a failed or stopped section does not stop the next. results.json is
# rewritten after every section, so a machine lost midway still returns the figures measured so far.
# --dry-run runs every section at toy size on the CPU, so the script is known to work before a GPU is lent.
# Needs only the working tree and the installed packages: no network, no ../shared, no zstandard.
# Test hook: TABLEFREE_GPU_SH_HANG=SECTION makes that section sleep instead of running (the deadline test).
set -uo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }
DRY_RUN=0
DEADLINE=540
ONLY=""
while (( $# )); do
    case $1 in
        --dry-run) DRY_RUN=1; shift ;;
        --deadline) DEADLINE=${2:?--deadline needs a number of seconds}; shift 2 ;;
        --only) ONLY=${2:?--only needs a comma-separated list of sections}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "gpu.sh: unknown option $1"; usage; exit 2 ;;
        *) break ;;
    esac
done
OUT=${1:-${OUT:-gpu-bench}}
if ! [[ $DEADLINE =~ ^[0-9]+$ ]] || (( DEADLINE < 30 )); then
    echo "gpu.sh: --deadline must be a whole number of seconds, at least 30 (got $DEADLINE)"; exit 2
fi
END=$((SECONDS + DEADLINE))
SECTIONS=(train data rehearse short eval)
declare -A WEIGHT=([train]=35 [data]=4 [rehearse]=30 [short]=12 [eval]=19)
GRACE=10    # at most this many seconds between SIGTERM and SIGKILL for a section out of time
RESERVE=5   # kept back for the last rewrite of results.json
for name in ${ONLY//,/ }; do
    [[ -n ${WEIGHT[$name]:-} ]] || { echo "gpu.sh: --only: unknown section $name (sections: ${SECTIONS[*]})"; exit 2; }
done
if [[ -n $ONLY && ( ,$ONLY, == *,short,* || ,$ONLY, == *,eval,* || ,$ONLY, == *,rehearse,* ) ]]; then
    ONLY="$ONLY,data"  # they read its files
fi
selected() { [[ -z $ONLY || ,$ONLY, == *,$1,* ]]; }

PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # works without `pip install -e .`
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu-sh.XXXXXX") || exit 1
rm -f "$OUT/results.json" "$OUT/gpu.log" "$OUT/short_run_metrics.jsonl" "$OUT/rehearsal.json"
exec > >(tee "$OUT/gpu.log") 2>&1
TEE_PID=$!
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; rm -rf "$SCRATCH"' EXIT  # the log is whole on exit
export PYTHON SCRATCH OUT
echo "gpu.sh: deadline ${DEADLINE} s, output $OUT, scratch $SCRATCH, $(date -u +%Y-%m-%dT%H:%M:%SZ)"

if (( DRY_RUN )); then
    DEVICE=cpu
    TRAIN_ARGS=(--device cpu --preset tiny --micro-batch 2 --seq-len 128 --steps 3 --warmup 1 --log-every 1)
    EVAL_ARGS=(--device cpu --preset tiny --dtype bfloat16 --batch-size 8 --limit 24 --sample 12 --block 6
               --tokenizer-mb 0.5)
    DATA_MB=0.5
    SHORT=(model.preset=tiny "budget=20 steps" batch_tokens=1024 micro_batch=8 seq_len=128 log_every=5
           val_every=10 val_batches=2)
    SHORT_VOCAB=2048
    REHEARSE=(--shape tiny --device cpu --procs 1 --steps 6)
    MIN_FREE_GB=1
else
    DEVICE=cuda
    TRAIN_ARGS=(--device cuda --preset paper-1.7b --micro-batch 4 --seq-len 2048 --steps 12 --warmup 4)
    EVAL_ARGS=(--device cuda --preset paper-1.7b --dtype bfloat16 --batch-size 64 --sample 200 --block 50)
    DATA_MB=4
    SHORT=(model.preset=small "budget=600 steps" batch_tokens=32768 micro_batch=64 seq_len=512 log_every=20
           val_every=100 val_batches=8)
    SHORT_VOCAB=8192
    REHEARSE=(--shape real --device cuda --procs 1 --steps 6)
    MIN_FREE_GB=10  # scratch data; run directories are deleted after each run (the rehearsal checks its own)
fi
export DEVICE SHORT_VOCAB

merge() {  # rewrite results.json from what the sections have left in the scratch directory
    "$PYTHON" benchmarks/gpu_results.py --scratch "$SCRATCH" --out "$OUT/results.json" \
        --deadline "$DEADLINE" --dry-run "$DRY_RUN" --elapsed "$SECONDS" || echo "gpu.sh: could not write results.json"
}

# --- up front: everything the sections need, checked before any of them spends device time
preflight() {
    command -v "$PYTHON" >/dev/null || { echo "preflight: $PYTHON not found (set PYTHON=...)"; return 1; }
    "$PYTHON" - "$DEVICE" "$SCRATCH/preflight.json" <<'PY' || return 1
import json, os, platform, sys
import torch, numpy, safetensors, tokenizers, tqdm, yaml  # noqa: F401 (the dependencies the sections use)
import tablefree.cli  # noqa: F401 (the train command; must not need optional codecs such as zstandard)
info = {"python": sys.version.split()[0], "torch": torch.__version__, "host": platform.node(),
        "cpus": os.cpu_count(), "cuda": torch.cuda.is_available()}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
print(", ".join(f"{k} {v}" for k, v in info.items()))
with open(sys.argv[2], "w") as out:
    json.dump(info, out)
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("preflight: no CUDA device visible to torch (use --dry-run to rehearse on the CPU)")
PY
    local free_gb
    free_gb=$(df -Pk "$SCRATCH" | awk 'NR == 2 {print int($4 / 1048576)}')
    if (( free_gb < MIN_FREE_GB )); then
        echo "preflight: only ${free_gb} GB free under $SCRATCH; need ${MIN_FREE_GB} GB"; return 1
    fi
    echo "free disk under $SCRATCH: ${free_gb} GB"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    fi
}
if ! preflight; then
    echo "gpu.sh: preflight failed; nothing was run"
    echo '{"name": "preflight", "status": "failed", "seconds": '"$SECONDS"'}' >> "$SCRATCH/sections.jsonl"
    merge
    exit 1
fi

FAILED=()
share_of() {  # share_of NAME: seconds for NAME out of the time left, by weight over the sections still to run
    local name=$1 rest=0 later=0 s
    for s in "${SECTIONS[@]}"; do
        if [[ $s == "$name" ]]; then later=1; fi
        if (( later )) && selected "$s"; then rest=$((rest + WEIGHT[$s])); fi
    done
    local left=$((END - SECONDS - RESERVE))
    echo $(( left * WEIGHT[$name] / rest ))
}
section() {  # section NAME COMMAND...: run it within its share (@SHARE@ in an argument becomes the share)
    local name=$1; shift
    selected "$name" || return 0
    local share status rc start=$SECONDS
    share=$(share_of "$name")
    if (( share < 5 )); then
        status="skipped: no time left before the deadline"
        rc=0
        echo "=== $name: $status"
    else
        local grace=$(( share / 10 < GRACE ? (share / 10 > 1 ? share / 10 : 1) : GRACE ))
        share=$((share - grace))  # SIGTERM at the share, SIGKILL a grace period later: both within it
        local args=("${@//@SHARE@/$share}")
        if [[ ${TABLEFREE_GPU_SH_HANG:-} == "$name" ]]; then args=(sleep 100000); fi  # the deadline test
        echo "=== $name (up to ${share} s): ${args[*]}"
        timeout --signal=TERM --kill-after="$grace" "$share" "${args[@]}"
        rc=$?
        case $rc in
            0) status=ok ;;
            124|137) status="stopped: out of its ${share} s share" ;;
            *) status="failed (exit status $rc)" ;;
        esac
        echo "=== $name: $status ($((SECONDS - start)) s)"
    fi
    [[ $status == ok || $status == skipped* ]] || FAILED+=("$name")
    printf '{"name": "%s", "status": "%s", "exit_status": %d, "seconds": %d, "share_s": %d}\n' \
        "$name" "$status" "$rc" "$((SECONDS - start))" "$share" >> "$SCRATCH/sections.jsonl"
    merge
}

short_run() {  # a smaller preset trained on the generated corpus, for a loss curve
    "$PYTHON" -m tablefree.cli data prepare "$SCRATCH/data/corpus" --out "$SCRATCH/short-data" \
        --vocab-size "$SHORT_VOCAB" --no-progress || return 1
    "$PYTHON" -m tablefree.cli train --run-dir "$SCRATCH/short" "data.dir=$SCRATCH/short-data" \
        "device=$DEVICE" checkpoint_format=none compile=false "${SHORT[@]}"
    local rc=$?  # a run stopped by the deadline still leaves its metrics and summary
    cp "$SCRATCH/short/metrics.jsonl" "$OUT/short_run_metrics.jsonl" 2>/dev/null
    cp "$SCRATCH/short/summary.json" "$SCRATCH/short_summary.json" 2>/dev/null
    return $rc
}
export -f short_run

section train "$PYTHON" benchmarks/train_gpu.py "${TRAIN_ARGS[@]}" --time-limit @SHARE@ --out "$SCRATCH/train.json"
section data "$PYTHON" benchmarks/gpu_data.py make --out "$SCRATCH/data" --max-mb "$DATA_MB"
rehearse() {  # configs/paper-1.7b.yaml rehearsed end to end (benchmarks/rehearse.sh), its record kept
    bash benchmarks/rehearse.sh "$@" --corpus "$SCRATCH/data/corpus" --tokenizer-corpus "$SCRATCH/data/corpus" \
        --fill-vocab "$SCRATCH/rehearse"
    local rc=$?  # a rehearsal stopped by the deadline still leaves the steps it finished
    cp "$SCRATCH/rehearse/rehearsal.json" "$OUT/rehearsal.json" 2>/dev/null
    if (( ! DRY_RUN )) && [[ -e $OUT/rehearsal.json ]]; then
        local results=${RESULTS_DIR:-docs/results/gpu}
        mkdir -p "$results" && cp "$OUT/rehearsal.json" "$results/rehearsal-$(date -u +%Y-%m-%d).json"
    fi
    return $rc
}
export -f rehearse
export DRY_RUN

section rehearse bash -c "rehearse $(printf '%q ' "${REHEARSE[@]}")"
section short bash -c "SHORT=($(printf '%q ' "${SHORT[@]}")); short_run"
section eval "$PYTHON" benchmarks/eval_speed.py "${EVAL_ARGS[@]}" --corpus "$SCRATCH/data/corpus" \
    --eval-data "$SCRATCH/data/eval" --out "$SCRATCH/eval.json"

if (( ${#FAILED[@]} )); then
    echo "gpu.sh: sections not ok: ${FAILED[*]} (${SECONDS} s of ${DEADLINE} s; results in $OUT)"
    exit 1
fi
echo "gpu.sh: all sections ok (${SECONDS} s of ${DEADLINE} s); results in $OUT"
