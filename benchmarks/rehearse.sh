#!/usr/bin/env bash
# A rehearsal of configs/paper-1.7b.yaml itself, end to end, before a cluster is lent. Run from the repository root:
#   bash benchmarks/rehearse.sh [--shape tiny|real] [--device cpu|cuda] [--procs N] [--steps N] [--corpus PATH]
#                               [--tokenizer-corpus PATH] [--tokenizer FILE] [--fill-vocab] OUT_DIR
# The config is used as shipped except for what a rehearsal must change, and nothing else (each is in
# OUT_DIR/rehearsal.json): the model shape (--shape tiny: d 128, 2 layers, 2 heads of 64, MLP 256, context 128,
# micro-batch 2; --shape real: the preset's own, micro-batch 8 × 2048 tokens), the budget cut to --steps steps
# (default 12; batch_tokens set to 2 micro-steps per process, so the world sizes below share one global batch),
# log_every 1, a validation of 2 batches at the end, a checkpoint every steps/3, and on the CPU only
# device=cpu compile=false precision=fp32 (the CPU is not the GPU the config is for).
#
# Steps, each checked, on real prepared data with a V = 49,152 tokenizer (trained here on --tokenizer-corpus,
# default ../shared/data/corpus/gutenberg-mix/quotations, unless --tokenizer names one; --corpus, default
# ../shared/data/corpus/gutenberg-mix/holidays, is the text prepared into shards; --fill-vocab adds to the
# tokenizer's text 120,000 random letter-words, each line twice, so that a corpus too small for 49,152 tokens
# still gives a tokenizer of exactly that size, as benchmarks/gpu.sh does with the 4 MB of text it generates):
#   1. reference: the uninterrupted run, FSDP2 over --procs processes (default 2), no checkpoints;
#   2. the same run with sharded checkpoints, killed with `kill -9` (every process of it) once its first
#      checkpoint is complete; resumed on --procs processes and killed again after its second; resumed on ONE
#      process (FSDP2, the DCP checkpoint resharded on load) to the end;
#   3. the resumed run's train losses equal the reference's at every step: exactly while the world size is the
#      same, to fp32 rounding (1e-5) after the resharding (another world size sums the micro-batches in another
#      order);
#   4. the sharded checkpoint written by --procs processes (at the real shape, which keeps one checkpoint, the
#      newest) exported (`tablefree export`), loaded with transformers where it is installed (logits equal in
#      fp32), the run evaluated (`tablefree eval --tasks validation`) and the checkpoint generated from.
# OUT_DIR receives rehearsal.json (rewritten after every step, so a run stopped midway keeps what it measured) and
# rehearsal.log. Exit status 0 only when every step passed.
set -uo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }
SHAPE=tiny
DEVICE=cpu
PROCS=2
STEPS=12
CORPUS=../shared/data/corpus/gutenberg-mix/holidays  # 1.2 MB: 0.3M tokens of shards
TOKENIZER_CORPUS=../shared/data/corpus/gutenberg-mix/quotations  # 7.8 MB: enough text for 49,152 tokens
TOKENIZER=""
FILL_VOCAB=0
while (( $# )); do
    case $1 in
        --shape) SHAPE=${2:?--shape needs tiny or real}; shift 2 ;;
        --device) DEVICE=${2:?--device needs cpu or cuda}; shift 2 ;;
        --procs) PROCS=${2:?--procs needs a number}; shift 2 ;;
        --steps) STEPS=${2:?--steps needs a number}; shift 2 ;;
        --corpus) CORPUS=${2:?--corpus needs a path}; shift 2 ;;
        --tokenizer-corpus) TOKENIZER_CORPUS=${2:?--tokenizer-corpus needs a path}; shift 2 ;;
        --tokenizer) TOKENIZER=${2:?--tokenizer needs a tokenizer.json}; shift 2 ;;
        --fill-vocab) FILL_VOCAB=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "rehearse.sh: unknown option $1"; usage; exit 2 ;;
        *) break ;;
    esac
done
OUT=${1:?rehearse.sh: give the output directory (OUT_DIR)}
[[ $SHAPE == tiny || $SHAPE == real ]] || { echo "rehearse.sh: --shape: expected tiny or real, got $SHAPE"; exit 2; }
[[ $DEVICE == cpu || $DEVICE == cuda ]] || { echo "rehearse.sh: --device: expected cpu or cuda, got $DEVICE"; exit 2; }
if ! [[ $PROCS =~ ^[1-9][0-9]*$ && $STEPS =~ ^[0-9]+$ ]] || (( STEPS < 6 || STEPS % 3 )); then
    echo "rehearse.sh: --procs must be >= 1 and --steps a multiple of 3, at least 6 (got $PROCS, $STEPS)"; exit 2
fi
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # works without `pip install -e .`
CONFIG=configs/paper-1.7b.yaml
VOCAB=49152
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
WORK=$OUT/work  # data and run directories; deleted at the end unless KEEP_WORK=1
rm -rf "$WORK" "$OUT/rehearsal.json" "$OUT/phases.jsonl"
mkdir -p "$WORK"
exec > >(tee "$OUT/rehearsal.log") 2>&1
TEE_PID=$!
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; [[ ${KEEP_WORK:-0} == 1 ]] || rm -rf "$WORK"' EXIT
echo "rehearse.sh: $CONFIG, shape $SHAPE, device $DEVICE, $PROCS processes, $STEPS steps, $(date -u +%Y-%m-%dT%H:%M:%SZ)"

EVERY=$((STEPS / 3))
if [[ $SHAPE == tiny ]]; then
    MICRO=2; SEQ=128
    SHAPE_ARGS=(model.d_model=128 model.n_layers=2 model.n_heads=2 model.n_kv_heads=2 model.d_ff=256
                model.max_seq_len=$SEQ)
else
    MICRO=8; SEQ=2048
    SHAPE_ARGS=(keep_last=1)  # each checkpoint of the real shape is about 20 GB (weights and Adam moments)
    # One process holds the whole optimizer state that 8-way FSDP divides: at micro-batch 8 without activation
    # checkpointing its memory plan is 71.7 GiB, over an 80 GB GPU's usable 67 GiB, and train would refuse it
    # (docs/distributed.md#memory-plan-tablefree-memory); with it, 32.2 GiB.
    (( PROCS == 1 )) && SHAPE_ARGS+=(activation_checkpointing=true)
fi
# two micro-steps per process at --procs, four on one process: the same global batch on both world sizes
RECIPE_ARGS=("${SHAPE_ARGS[@]}" "micro_batch=$MICRO" "seq_len=$SEQ" "batch_tokens=$((2 * PROCS * MICRO * SEQ))"
             "budget=$STEPS steps" "schedule.warmup_steps=$EVERY" log_every=1 "val_every=$STEPS" val_batches=2
             "checkpoint_every=$EVERY" parallel=fsdp)
[[ $SHAPE == tiny ]] && RECIPE_ARGS+=(keep_last=0)
if [[ $DEVICE == cpu ]]; then RECIPE_ARGS+=(device=cpu compile=false precision=fp32); fi

phase() {  # phase NAME STATUS [SECONDS] [JSON fields]: one line of phases.jsonl, then rehearsal.json rewritten
    printf '{"phase": "%s", "status": "%s", "seconds": %s%s}\n' "$1" "$2" "${3:-0}" "${4:+, $4}" >> "$OUT/phases.jsonl"
    "$PYTHON" - "$OUT" "$SHAPE" "$DEVICE" "$PROCS" "$STEPS" "${RECIPE_ARGS[@]}" <<'PY'
import json, os, sys
out, shape, device, procs, steps, *overrides = sys.argv[1:]
phases = [json.loads(line) for line in open(os.path.join(out, "phases.jsonl"))]
record = {"config": "configs/paper-1.7b.yaml", "shape": shape, "device": device, "processes": int(procs),
          "steps": int(steps), "overrides": overrides, "phases": phases,
          "ok": all(p["status"] == "ok" for p in phases)}
tmp = os.path.join(out, ".rehearsal.json.tmp")
with open(tmp, "w") as handle:
    json.dump(record, handle, indent=2, allow_nan=False)
os.replace(tmp, os.path.join(out, "rehearsal.json"))
PY
}
fail() { echo "rehearse.sh: $1: FAILED${2:+: $2}"; phase "$1" "failed${2:+: $2}" "${3:-0}"; exit 1; }

train_cmd() {  # train_cmd PROCESSES RUN_DIR ARGS...: the config's training command at that world size
    local procs=$1 run=$2; shift 2
    local launcher=("$PYTHON" -m tablefree.cli)
    if (( procs > 1 )); then
        launcher=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$procs" -m tablefree.cli)
    fi
    echo "${launcher[@]} train --config $CONFIG --run-dir $run data.dir=$WORK/data ${RECIPE_ARGS[*]} $*" >&2
    "${launcher[@]}" train --config "$CONFIG" --run-dir "$run" "data.dir=$WORK/data" "${RECIPE_ARGS[@]}" "$@"
}

killed_at_checkpoint() {  # killed_at_checkpoint STEP PROCESSES RUN_DIR ARGS...: train; kill -9 once STEP is saved
    local step=$1 procs=$2 run=$3; shift 3
    local marker
    marker=$(printf '%s/checkpoints/step_%08d/COMPLETE' "$run" "$step")
    bash -c "$(declare -f train_cmd); $(declare -p PYTHON CONFIG WORK RECIPE_ARGS); train_cmd $procs $run $*" &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null && [[ ! -e $marker ]]; do sleep 0.05; done
    # the launcher and every training process at once, as a lost node would go (torchrun starts its workers in
    # sessions of their own, so the process tree is collected, not a process group)
    local tree
    tree=$(process_tree "$pid")
    kill -9 $tree 2>/dev/null
    wait "$pid" 2>/dev/null
    local p
    for p in $tree; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
    [[ -e $marker && ! -e $run/summary.json ]]  # saved, and killed before it could finish
}

process_tree() {  # process_tree PID: PID and all its descendants
    local child
    echo "$1"
    for child in $(ps -o pid= --ppid "$1"); do process_tree "$child"; done
}

# 1. data: a V = 49,152 tokenizer and the shards it makes
start=$SECONDS
if [[ $SHAPE == real ]]; then  # two checkpoints at once while the newer one is saved, and the export
    free_gb=$(df -Pk "$WORK" | awk 'NR == 2 {print int($4 / 1048576)}')
    (( free_gb >= 50 )) || fail data "only ${free_gb} GB free under $WORK; the real shape needs 50 GB" 0
fi
if [[ -z $TOKENIZER ]]; then
    TOKENIZER=$WORK/tokenizer.json
    TOKENIZER_TEXT=("$TOKENIZER_CORPUS")
    if (( FILL_VOCAB )); then
        TOKENIZER_TEXT+=("$WORK/fill-words.txt")
        "$PYTHON" - "$WORK/fill-words.txt" <<'PY' || fail data "writing the filler words" $((SECONDS - start))
import sys
import numpy as np
rng = np.random.default_rng(0)  # the same words every time
letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
words = ["".join(rng.choice(letters, size=n)) for n in rng.integers(4, 11, 120_000)]
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for i in range(0, len(words), 12):
        line = " ".join(words[i : i + 12]) + "\n"
        out.write(line + line)  # twice: BPE merges only pairs seen more than once
PY
    fi
    "$PYTHON" -m tablefree.cli tokenizer train "${TOKENIZER_TEXT[@]}" --vocab-size "$VOCAB" -o "$TOKENIZER" \
        --strip-gutenberg || fail data "tokenizer training" $((SECONDS - start))
fi
"$PYTHON" -m tablefree.cli data prepare "$CORPUS" --tokenizer "$TOKENIZER" --out "$WORK/data" --no-progress \
    --strip-gutenberg --val-fraction 0.2 || fail data "data prepare" $((SECONDS - start))
vocab=$("$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$WORK/data/manifest.json")
(( vocab == VOCAB )) \
    || fail data "the tokenizer has $vocab tokens, not $VOCAB (train it on more text, or --fill-vocab)" $((SECONDS - start))
phase data ok $((SECONDS - start)) "\"vocab_size\": $vocab"

# 2. the reference, uninterrupted
start=$SECONDS
train_cmd "$PROCS" "$WORK/reference" checkpoint_format=none || fail reference "training" $((SECONDS - start))
phase reference ok $((SECONDS - start))

# 3. killed, resumed on the same world size, killed, resumed on one process
start=$SECONDS
RUN=$WORK/run
killed_at_checkpoint "$EVERY" "$PROCS" "$RUN" checkpoint_format=sharded \
    || fail "kill -9 after step $EVERY" "no checkpoint, or the run finished first" $((SECONDS - start))
phase "killed after step $EVERY ($PROCS processes)" ok $((SECONDS - start))
start=$SECONDS
killed_at_checkpoint $((2 * EVERY)) "$PROCS" "$RUN" checkpoint_format=sharded --resume \
    || fail "resume on $PROCS, kill -9 after step $((2 * EVERY))" "no checkpoint, or the run finished first" $((SECONDS - start))
phase "resumed on $PROCS processes, killed after step $((2 * EVERY))" ok $((SECONDS - start))
start=$SECONDS
train_cmd 1 "$RUN" checkpoint_format=sharded --resume || fail "resume on 1 process" "training" $((SECONDS - start))
if (( PROCS > 1 )); then resumed="resumed on 1 process (resharded) to the end"; else resumed="resumed to the end"; fi
phase "$resumed" ok $((SECONDS - start))

# 4. the losses
start=$SECONDS
equal=$("$PYTHON" - "$WORK/reference" "$RUN" "$((2 * EVERY))" "$PROCS" <<'PY'
import json, sys
reference, run, same_until, procs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def losses(directory):
    records = [json.loads(line) for line in open(f"{directory}/metrics.jsonl")]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}  # a step logged again: the last
ref, got = losses(reference), losses(run)
assert list(got) == list(ref), f"steps {list(got)} against the reference's {list(ref)}"
exact = [s for s in ref if s <= same_until or procs == 1]
worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in ref if s not in exact), default=0.0)
bad = [s for s in exact if got[s] != ref[s]]
print(json.dumps({"steps": len(ref), "exact_steps": len(exact), "exactly_equal": not bad,
                  "max_relative_difference_after_resharding": worst, "ok": not bad and worst <= 1e-5,
                  "final_train_loss": ref[max(ref)], "first_train_loss": ref[min(ref)]}))
PY
) || fail losses "could not compare" $((SECONDS - start))
echo "losses: $equal"
[[ $equal == *'"ok": true'* ]] || fail losses "$equal" $((SECONDS - start))
phase losses ok $((SECONDS - start)) "\"losses\": $equal"

# 5. the readers, on the sharded checkpoint that --procs processes wrote, and on the run's newest
start=$SECONDS
SHARDED=$(printf '%s/checkpoints/step_%08d' "$RUN" $((2 * EVERY)))
[[ -d $SHARDED ]] || SHARDED=$(ls -d "$RUN"/checkpoints/step_* | tail -n 1)  # keep_last=1: the newest
[[ -e $SHARDED/sharded/.metadata && ! -e $SHARDED/model.safetensors ]] || fail export "$SHARDED is not sharded" 0
"$PYTHON" -m tablefree.cli export "$SHARDED" --format hf "$WORK/export" || fail export "tablefree export" $((SECONDS - start))
logits=$("$PYTHON" - "$SHARDED" "$WORK/export" <<'PY'
import json, sys
import torch
from tablefree.checkpoint.model_dir import load_model
try:
    import transformers
except ImportError:
    print(json.dumps({"transformers": None, "ok": True}))
    sys.exit(0)
model = load_model(sys.argv[1])[0]
hf = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32).eval()
ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0)).to(
    next(model.parameters()).device)
with torch.no_grad():
    ours, theirs = model(ids).float().cpu(), hf(ids.cpu()).logits
difference = float((ours - theirs).abs().max() / ours.abs().max())
print(json.dumps({"transformers": transformers.__version__, "max_relative_difference": difference,
                  "ok": difference <= 1e-5}))
PY
) || fail export "transformers" $((SECONDS - start))
echo "export: $logits"
[[ $logits == *'"ok": true'* ]] || fail export "$logits" $((SECONDS - start))
phase export ok $((SECONDS - start)) "\"logits\": $logits"
start=$SECONDS
"$PYTHON" -m tablefree.cli eval "$RUN" --tasks validation --val-data "$WORK/data" --limit 8 \
    --out "$WORK/eval.json" --device "$DEVICE" || fail eval "tablefree eval" $((SECONDS - start))
val=$("$PYTHON" -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['tasks']['validation']['metrics']))" "$WORK/eval.json")
phase eval ok $((SECONDS - start)) "\"validation\": $val"
start=$SECONDS
text=$("$PYTHON" -m tablefree.cli generate "$SHARDED" --prompt "The" --max-new-tokens 16 --seed 0 \
    --no-echo --device "$DEVICE") || fail generate "tablefree generate" $((SECONDS - start))
echo "generated: $text"
phase generate ok $((SECONDS - start)) "\"text\": $("$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$text")"
echo "rehearse.sh: every step ok (${SECONDS} s); $OUT/rehearsal.json"
