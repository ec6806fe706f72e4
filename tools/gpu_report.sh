#!/usr/bin/env bash
# One command measures every GPU target of docs/BENCHMARKS.md and writes ONE markdown report.
#
#   source .gpu/device_env.sh && bash tools/gpu_report.sh OUT_DIR     # one H100/H200: under 9 minutes
#   bash tools/gpu_report.sh OUT_DIR --smoke                          # CPU, tiny sizes, same steps (a test runs it)
#
# OUT_DIR (new or empty) receives REPORT.md (device, torch, commit, date; tables of tokens/s, MFU, step
# time, peak memory, host syncs and the ratio of each figure to its target), artifacts.tar.gz (every
# step's log and JSON, the runs' metrics.jsonl; no checkpoints) and the working files. On a copy of the
# repository without .git, set GPU_REPORT_COMMIT to the commit it is.
#
# Steps, in this order (the data step runs in the background while the first GPU step runs):
#   data        generated corpus (tools/make_corpus.py) -> byte-level BPE tokenizer trained on it
#               (tools/train_tokenizer.py --vocab-size 2048: OUT_DIR/tokenizer) -> indexed dataset
#   loss        LM head + cross-entropy alone: fused (Liger, Triton) vs chunked, host syncs of each
#   train-*     the shipped examples/llama_4x5.yaml and examples/qwen_4x7.yaml through the deepspeed
#               launcher on that data, GPU_REPORT_TRAIN_STEPS steps (20), global batch = the config's
#               micro-batch x GPU_REPORT_ACCUMULATION (1): as shipped (checkpointing auto) and with
#               model.activation_checkpointing=per_loop
#   ckpt        checkpointing modes at micro-batch 38 (the paper's), none at micro-batch 8 as reference
#   peers       our step vs HF transformers Llama at equal widths/depth/micro-batch, eager and compiled
#   recompute   recompute cost of selective and per_loop loops, in loop forwards (the auto planner's unit)
#   profile     torch.profiler table of one step of the shipped Llama 4x5 model
#   kept        loop vs NonLoop, recompiles across r and the Muon share (targets kept from earlier rounds)
# Each step runs under its own time limit and the whole run under GPU_REPORT_BUDGET_S (default 500 s;
# a step that would start with less than 20 s left is skipped); a step that fails or runs out of time
# is reported as such and the rest still run. GPU_REPORT_ONLY=id,id,... runs only those steps.
# Exit status: 0 when every step that ran succeeded, 1 otherwise (the report is written either way).
set -uo pipefail

usage="usage: bash tools/gpu_report.sh OUT_DIR [--smoke]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "error: $usage" >&2; exit 2; }
OUT_ARG=$1
SMOKE=0
if [ $# -eq 2 ]; then
  [ "$2" = --smoke ] || { echo "error: unknown option '$2'; $usage" >&2; exit 2; }
  SMOKE=1
fi
[ "${GPU_REPORT_DEVICE:-cuda}" = cpu ] && SMOKE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=$(realpath -m "$OUT_ARG")
if [ -e "$OUT" ] && { [ ! -d "$OUT" ] || [ -n "$(ls -A "$OUT")" ]; }; then
  echo "error: OUT_DIR '$OUT_ARG' exists and is not an empty folder; expected a new or empty folder" >&2
  exit 2
fi
mkdir -p "$OUT/logs" "$OUT/runs" || { echo "error: OUT_DIR '$OUT_ARG': cannot create it" >&2; exit 2; }

PY=${PYTHON:-python3}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
       WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
BUDGET=${GPU_REPORT_BUDGET_S:-$([ $SMOKE = 1 ] && echo 900 || echo 500)}
START=$(date +%s)
RESERVE=20      # seconds kept for the report (and a killed step's grace period)
MIN_STEP_S=20   # a step is not started with less time than this left
STEPS_TSV=$OUT/steps.tsv
: > "$STEPS_TSV"

if [ $SMOKE = 1 ]; then
  DEVICE=cpu
  CAP_SCALE=3   # a loaded 2-core CI machine; the first DeepSpeed launch also JIT-builds its CPU shm op
  CORPUS=(--prose-docs 200 --reasoning-docs-per-task 50 --valid-docs 2 --eval-items-per-depth 1)
  WORKERS=1
  TRAIN_STEPS=${GPU_REPORT_TRAIN_STEPS:-3}
  SKIP_STEPS=1  # steps left out of the medians (compilation, allocator warm-up)
  # the shipped configs at CPU widths (the same block structure), short sequences
  TRAIN_MICRO=2
  TRAIN_SIZE=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_attention_heads=2
              --set model.num_key_value_heads=1 --set model.head_dim=32 --set model.vocab_size=2048
              --set model.rope_scaling=null --set train.seq_length=32 --set train.micro_batch_size=$TRAIN_MICRO)
  BENCH=(--device cpu --steps 1 --warmup 0 --seq 16)
  MB_SMALL=1 MB_PAPER=2 TOP=8
  COMPILE=() CKPT_BUDGET=() KEPT_MODES=loop-vs-nonloop,optimizer
  MODULES="torch deepspeed megatron.core transformers"
else
  DEVICE=cuda
  CAP_SCALE=1
  CORPUS=(--prose-docs 4000 --reasoning-docs-per-task 1500 --valid-docs 10 --eval-items-per-depth 1)
  WORKERS=8
  TRAIN_STEPS=${GPU_REPORT_TRAIN_STEPS:-20}
  SKIP_STEPS=3
  TRAIN_MICRO=  # the config's own
  TRAIN_SIZE=()
  BENCH=(--device cuda --steps 6 --warmup 2)
  MB_SMALL=8 MB_PAPER=38 TOP=15
  COMPILE=(--compile) CKPT_BUDGET=(--ac-budget-gib 50) KEPT_MODES=loop-vs-nonloop,compile,optimizer
  MODULES="torch triton deepspeed megatron.core transformers liger_kernel"
fi
ACCUMULATION=${GPU_REPORT_ACCUMULATION:-1}

log() { printf '[gpu_report %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
record() {  # record ID STATUS RC WALL_S LIMIT_S COMMAND: one line of steps.tsv (read by tools/bench_report.py)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >> "$STEPS_TSV"
}
selected() { [ -z "${GPU_REPORT_ONLY:-}" ] || [[ ",$GPU_REPORT_ONLY," == *",$1,"* ]]; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
limit_for() {  # limit_for CAP_S: the step's limit (x CAP_SCALE), bounded by what is left of the run's budget
  local cap=$(( $1 * CAP_SCALE )) left=$(( START + BUDGET - RESERVE - $(date +%s) ))
  echo $(( cap < left ? cap : left ))
}

run_step() {  # run_step ID CAP_S COMMAND...: the command under its limit, its output in logs/ID.log
  local id=$1 cap=$2
  shift 2
  local cmd="$*"
  if ! selected "$id"; then record "$id" "skipped: not in GPU_REPORT_ONLY" "" 0 0 "$cmd"; return 0; fi
  local limit
  limit=$(limit_for "$cap")
  if [ "$limit" -lt $MIN_STEP_S ]; then
    log "$id: skipped (out of time)"
    record "$id" "skipped: out of time" "" 0 0 "$cmd"
    return 0
  fi
  log "$id (limit ${limit} s): $cmd"
  local t0 rc status
  t0=$(now)
  # its own process group: timeout signals the whole group (the launcher's workers too)
  timeout -k 15 "$limit" "$@" > "$OUT/logs/$id.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out" ;;
    *) status=failed ;;
  esac
  log "$id: $status (rc $rc, $(elapsed "$t0") s)"
  record "$id" "$status" "$rc" "$(elapsed "$t0")" "$limit" "$cmd"
  [ $rc = 0 ]
}

prepare_data() {  # corpus -> tokenizer -> indexed dataset, in OUT_DIR
  set -e
  "$PY" tools/make_corpus.py --output-dir "$OUT/corpus" --seed 0 "${CORPUS[@]}"
  "$PY" tools/train_tokenizer.py --input "$OUT/corpus/train.jsonl" --output "$OUT/tokenizer" --vocab-size 2048
  "$PY" tools/preprocess_data.py --input "$OUT/corpus/train.jsonl" --tokenizer "$OUT/tokenizer" \
      --output-prefix "$OUT/data/corpus" --workers "$WORKERS" --no-progress
}

free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
config_micro_batch() { "$PY" -c "import sys; from megatron_loop.config import load_config; print(load_config(sys.argv[1]).train.micro_batch_size)" "$1"; }

train_run() {  # train_run ID CONFIG CAP_S [--set ...]: the shipped config through the deepspeed launcher
  local id=$1 config=$2 cap=$3
  shift 3
  if [ ! -f "$OUT/data/corpus.idx" ]; then
    record "$id" "skipped: no data (step data did not finish)" "" 0 0 "$config $*"
    return 0
  fi
  local micro=$TRAIN_MICRO
  [ -n "$micro" ] || micro=$(config_micro_batch "$config") || micro=1
  run_step "$id" "$cap" deepspeed --num_gpus 1 --master_port "$(free_port)" pretrain_loop.py --config "$config" \
      "${TRAIN_SIZE[@]}" --set "train.max_steps=$TRAIN_STEPS" --set train.train_tokens=null \
      --set "train.global_batch_size=$(( micro * ACCUMULATION ))" --set "train.output_dir=$OUT/runs/$id" \
      --set train.save_interval=1000000 --set train.eval_interval=0 --set train.log_interval=1 \
      --set "data.train_prefixes=[$OUT/data/corpus]" --set "data.valid_prefixes=[]" \
      --set "data.tokenizer=$OUT/tokenizer" --set logging.wandb_project=null --set logging.progress_bar=false "$@"
  local rc=$?
  rm -rf "$OUT/runs/$id/checkpoints"/global_step*  # the final save is not needed, and 6 GB a run on GPU
  return $rc
}

bench() {  # bench ID CAP_S ARGS...: one tools/bench.py run writing OUT_DIR/ID.json
  local id=$1 cap=$2
  shift 2
  run_step "$id" "$cap" "$PY" tools/bench.py "${BENCH[@]}" "$@" --json "$OUT/$id.json"
}

log "report of $DEVICE ($([ $SMOKE = 1 ] && echo 'CPU smoke: tiny sizes' || echo 'GPU')) into $OUT; budget $BUDGET s"
# shellcheck disable=SC2086
missing=$("$PY" -c "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))" \
          $MODULES 2>&1) || missing="$PY: cannot run ($missing)"
if [ -n "$missing" ]; then
  echo "error: $missing: missing for $PY; on the GPU machine run 'source .gpu/device_env.sh' first" >&2
  exit 2
fi

# data in the background: the first GPU step does not need it
DATA_LIMIT=$(limit_for 120)
if [ "$DATA_LIMIT" -lt $MIN_STEP_S ]; then
  record data "skipped: out of time" "" 0 0 ""
  DATA_PID=
elif selected data; then
  ( t0=$(now); timeout -k 10 "$DATA_LIMIT" bash -c "$(declare -f prepare_data); $(declare -p PY OUT CORPUS WORKERS); prepare_data" \
        > "$OUT/logs/data.log" 2>&1
    rc=$?; status=ok; [ $rc = 0 ] || status=$([ $rc = 124 ] || [ $rc = 137 ] && echo "timed out" || echo failed)
    record data "$status" "$rc" "$(elapsed "$t0")" "$DATA_LIMIT" "make_corpus.py ${CORPUS[*]}; train_tokenizer.py --vocab-size 2048; preprocess_data.py --workers $WORKERS" ) &
  DATA_PID=$!
else
  record data "skipped: not in GPU_REPORT_ONLY" "" 0 0 ""
  DATA_PID=
fi

FAILED=0
bench loss 60 --mode loss --families llama,qwen --micro-batch $MB_SMALL || FAILED=1
[ -n "$DATA_PID" ] && wait "$DATA_PID"
train_run train-llama examples/llama_4x5.yaml 150 || FAILED=1
train_run train-llama-per_loop examples/llama_4x5.yaml 110 --set model.activation_checkpointing=per_loop || FAILED=1
train_run train-qwen examples/qwen_4x7.yaml 150 || FAILED=1
train_run train-qwen-per_loop examples/qwen_4x7.yaml 110 --set model.activation_checkpointing=per_loop || FAILED=1
bench ckpt 90 --mode checkpointing "${COMPILE[@]}" --families llama --loops 5 --micro-batch $MB_PAPER \
    --ac-modes none,per_loop,selective,auto --ac-reference-micro-batch $MB_SMALL "${CKPT_BUDGET[@]}" || FAILED=1
bench peers 150 --mode peers "${COMPILE[@]}" --families llama --micro-batch $MB_SMALL || FAILED=1
bench recompute 60 --mode recompute "${COMPILE[@]}" --families llama --loops 5 --micro-batch $MB_SMALL || FAILED=1
bench profile 60 --mode profile "${COMPILE[@]}" --config examples/llama_4x5.yaml --micro-batch $MB_SMALL \
    --top $TOP || FAILED=1
bench kept 120 --mode $KEPT_MODES "${COMPILE[@]}" --families llama --micro-batch $MB_SMALL --accumulation 2 || FAILED=1  # the Muon share at G = 1824 is extrapolated from t_opt and t_seq
if [ $SMOKE = 1 ]; then  # what CPU cannot run in a test's time, listed so the report says so
  record loss-fused "skipped on CPU: Liger's Triton kernel runs on CUDA (the loss step times chunked only)" "" 0 0 ""
  record peers-compiled "skipped on CPU: inductor compiles take minutes on CPU (the peers step runs eager only)" "" 0 0 ""
  record kept-compile "skipped on CPU: inductor compiles take minutes on CPU (recompiles across r: tests/test_perf_compile.py)" "" 0 0 ""
fi
awk -F'\t' '$2 == "failed" || $2 == "timed out" { bad = 1 } END { exit !bad }' "$STEPS_TSV" && FAILED=1

"$PY" tools/bench_report.py "$OUT" --skip-steps $SKIP_STEPS --budget-s "$BUDGET" --started "$START" \
    $([ $SMOKE = 1 ] && echo --smoke) || FAILED=1
# shellcheck disable=SC2046
tar -czf "$OUT/artifacts.tar.gz.tmp" -C "$OUT" --exclude='global_step*' --exclude='zero_to_*.py' steps.tsv logs runs $(cd "$OUT" && ls ./*.json 2>/dev/null) \
    && mv "$OUT/artifacts.tar.gz.tmp" "$OUT/artifacts.tar.gz"
log "report: $OUT/REPORT.md ($(( $(date +%s) - START )) s)"
exit $FAILED
