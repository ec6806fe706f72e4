#!/usr/bin/env bash
# The first GPU session, one command of at most ~9 minutes: the headline figures first, every result
# in OUT_DIR the moment it exists, so a command killed at its limit still returns what it measured.
#
#   bash tools/gpu_first.sh "$OUT"                # the device (one H100/H200; carry .gpu: tools/gpu_wheels.sh)
#   bash tools/gpu_first.sh OUT_DIR --smoke       # CPU, tiny sizes, the same steps (tests/integration/tools/test_gpu_first.py)
#
# OUT_DIR (new or empty: the device's $OUT) receives at most these 7 files, each as soon as it exists:
#   first.log       everything printed, each step's output streamed while it runs
#   summary.md      the figures so far, rewritten after every step (tools/bench_report.py --first);
#                   printed again as the last thing the command says
#   steps.tsv       per step: id, status, exit code, seconds, limit, command
#   kernel.json     the kernel check (megatron_loop/measure/loss_check.py)
#   headline.jsonl  the headline run's metrics.jsonl; second.jsonl the second run's
#   loss.json       bench.py --mode loss
# The rest (step logs, data, run folders) stays in GPU_FIRST_WORK (default: a new folder in /tmp).
#
# Steps, in this order, each under its own limit (tools/gpu_steps.sh: the whole process tree ends
# at the limit, SIGTERM then SIGKILL) and the whole command under GPU_FIRST_BUDGET_S (540 s):
#   install   the kit's wheels (.gpu/whl) into a folder on PYTHONPATH (tools/gpu_env.sh install), pip's
#             errors shown; none there: the packages already installed are used
#   preamble  real imports of torch, triton, deepspeed, megatron.core, transformers, the Liger kernel
#             module and megatron_loop's training path; versions, nvidia-smi, df -h (tools/gpu_env.sh
#             check). A failure here ends the command (exit 1) with the failed import named last
#   data      the corpus, tokenizer and indexed dataset carried in .gpu/data (tools/gpu_wheels.sh),
#             else built here (~20 s)
#   kernel    fused vs chunked loss and both gradients in bf16 against an fp32 reference at the Llama
#             and Qwen vocabularies, host syncs counted; if it fails, the training runs use
#             model.loss_implementation=chunked and the summary says so
#   headline  deepspeed --num_gpus 1 pretrain_loop.py --config examples/llama_4x5.yaml as shipped
#             (compile, fused loss, checkpointing auto, ZeRO-1 bf16 with fp32 gradient accumulation),
#             data overridden, micro-batch 38 x accumulation 2, 12 steps, no final checkpoint
#   second    the same with model.recompute=per_loop (step train-per_loop), or, if the
#             headline failed, with model.compile=false (step train-eager); fail-fast: no other
#             training run starts after a failed one
#   loss      bench.py --mode loss (fused vs chunked speed, host syncs)
# Exit status: 0 when every step that ran succeeded, 1 otherwise (the summary is written either way),
# 2 on bad usage. Knobs: GPU_FIRST_BUDGET_S, GPU_FIRST_TRAIN_STEPS (12), GPU_FIRST_WORK,
# GPU_KIT (.gpu), GPU_FIRST_DATA (a prepared data folder), GPU_REPORT_COMMIT (the commit, for a copy
# of the tree without .git), PYTHON (python3).
set -uo pipefail

usage="usage: bash tools/gpu_first.sh OUT_DIR [--smoke]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "error: $usage" >&2; exit 2; }
OUT_ARG=$1
SMOKE=0
if [ $# -eq 2 ]; then
  [ "$2" = --smoke ] || { echo "error: unknown option '$2'; $usage" >&2; exit 2; }
  SMOKE=1
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=$(realpath -m "$OUT_ARG")
if [ -e "$OUT" ] && { [ ! -d "$OUT" ] || [ -n "$(ls -A "$OUT")" ]; }; then
  echo "error: OUT_DIR '$OUT_ARG' exists and is not an empty folder; expected a new or empty folder" >&2
  exit 2
fi
mkdir -p "$OUT" || { echo "error: OUT_DIR '$OUT_ARG': cannot create it" >&2; exit 2; }
WORK=${GPU_FIRST_WORK:-$(mktemp -d /tmp/gpu_first.XXXXXX)}
mkdir -p "$WORK/logs" "$WORK/runs" || { echo "error: GPU_FIRST_WORK '$WORK': cannot create it" >&2; exit 2; }

exec > >(tee -a "$OUT/first.log") 2>&1  # everything from here on reaches OUT_DIR as it is printed
TEE_PID=$!

PY=${PYTHON:-python3}
KIT=${GPU_KIT:-$ROOT/.gpu}
START=$(date +%s)
BUDGET=${GPU_FIRST_BUDGET_S:-$([ $SMOKE = 1 ] && echo 900 || echo 540)}
RESERVE=8      # seconds kept for the last summary
MIN_STEP_S=10  # no step starts with less than this left
STEPS_TSV=$OUT/steps.tsv
STEP_LOGS=$WORK/logs
GS_NAME=gpu_first
GS_STREAM=1
# shellcheck source=tools/gpu_steps.sh
source "$ROOT/tools/gpu_steps.sh"
: > "$STEPS_TSV"

if [ $SMOKE = 1 ]; then
  CAP_SCALE=3     # a loaded 2-core CI machine
  CHECK=()
  # the shipped config at CPU widths (the same block structure), short sequences; the model keeps the
  # tokenizer's 2048 ids. save_interval 2 of 3 steps: the interval save stays, the final one is skipped
  TRAIN_SIZE=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_attention_heads=2
              --set model.num_key_value_heads=1 --set model.head_dim=32 --set model.vocab_size=2048
              --set model.rope_scaling=null --set train.seq_length=32
              --set logging.peak_tflops=0.05)  # a declared CPU peak: training logs MFU only against a known one
  MICRO=2 SAVE_INTERVAL=2 SKIP=1
  TRAIN_STEPS=${GPU_FIRST_TRAIN_STEPS:-3}
  KERNEL=(--device cpu --vocab 512 --hidden 64 --tokens 300 --chunk 128)
  LOSS_BENCH=(--device cpu --steps 1 --warmup 0 --seq 16 --micro-batch 1)
  CORPUS=(--prose-docs 200 --reasoning-docs-per-task 50 --valid-docs 2 --eval-items-per-depth 1)
  WORKERS=1
else
  CAP_SCALE=1
  CHECK=(--cuda)
  TRAIN_SIZE=()
  MICRO=38 SAVE_INTERVAL=1000000 SKIP=3  # the paper's micro-batch; medians leave out compile and warm-up
  TRAIN_STEPS=${GPU_FIRST_TRAIN_STEPS:-12}
  KERNEL=(--device cuda)
  LOSS_BENCH=(--device cuda --steps 6 --warmup 2 --micro-batch 8)
  CORPUS=(--prose-docs 4000 --reasoning-docs-per-task 1500 --valid-docs 10 --eval-items-per-depth 1)
  WORKERS=8
fi
ACCUMULATION=2  # fp32 gradient accumulation across micro-batches runs in every training step
SUMMARY_ARGS=("$OUT" --first --logs "$STEP_LOGS" --skip-steps "$SKIP" --budget-s "$BUDGET" --started "$START")
[ $SMOKE = 1 ] && SUMMARY_ARGS+=(--smoke)

summarize() {  # summary.md from what is there now (no torch import: well under a second)
  "$PY" tools/bench_report.py "${SUMMARY_ARGS[@]}" > /dev/null 2>> "$STEP_LOGS/summary.log" \
      || gs_log "summary: tools/bench_report.py failed (its error: $STEP_LOGS/summary.log)"
}

finish() {  # finish EXIT_CODE: the last summary, printed; wait for the log to reach OUT_DIR
  summarize
  echo
  [ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"
  gs_log "first session: exit code $1 after $(( $(date +%s) - START )) s; results in $OUT ($(cd "$OUT" && ls | tr '\n' ' '))"
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$1"
}

abort() {  # abort STEP: a step the rest cannot do without failed: say why (its last error line), stop
  local why
  why=$(grep -E '^(error:|[A-Za-z_.]*(Error|Exception)\b)' "$STEP_LOGS/$1.log" 2>/dev/null | tail -1)
  gs_log "ABORTED at step $1: ${why:-see its output above}"
  printf '%s\n' "$1" > "$STEP_LOGS/aborted"
  finish 1
}

gs_log "first GPU session ($([ $SMOKE = 1 ] && echo 'CPU smoke: tiny sizes' || echo GPU)) into $OUT; work folder $WORK; budget $BUDGET s"

# ------------------------------------------------------------------ install, preamble
export GPU_SITE=$WORK/site
if [ -d "$KIT/whl" ] && { [ $SMOKE = 0 ] || [ -n "${GPU_KIT:-}" ]; }; then
  run_step install 90 bash tools/gpu_env.sh install "$KIT" || abort install
else
  record install "skipped: no kit at $KIT/whl$([ $SMOKE = 1 ] && echo ' (CPU smoke: the installed packages)'); the packages already installed are used" "" 0 0 ""
fi
eval "$(bash tools/gpu_env.sh exports)"
run_step preamble 45 bash tools/gpu_env.sh check "${CHECK[@]}" || abort preamble
if [ $SMOKE = 1 ]; then
  "$PY" -c "import sys; sys.path.insert(0, 'tools'); from benchmarks.tables import cpu_name; print(cpu_name())" \
      > "$STEP_LOGS/device.txt" 2>/dev/null || echo CPU > "$STEP_LOGS/device.txt"
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 > "$STEP_LOGS/device.txt"
fi
summarize

# ------------------------------------------------------------------ data
DATA=${GPU_FIRST_DATA:-$KIT/data}
if prepared_data "$DATA"; then
  gs_log "data: the prepared corpus $DATA (corpus.bin/.idx, tokenizer/)"
  record data ok 0 0 0 "prepared: $DATA"
else
  DATA=$WORK/data
  data_step 60 "$DATA" "$WORK" "$WORKERS" "${CORPUS[@]}" || TRAIN_FAILED=data
fi

# ------------------------------------------------------------------ kernel check
LOSS_SET=()
if ! run_step kernel 60 "$PY" -m megatron_loop.measure.loss_check "${KERNEL[@]}" --json "$OUT/kernel.json"; then
  if [ "$(step_status kernel)" != "skipped: out of time" ]; then
    LOSS_SET=(--set model.loss_implementation=chunked)
    gs_log "kernel check failed: the training runs use model.loss_implementation=chunked"
    echo "the kernel check failed: the training runs used model.loss_implementation=chunked" >> "$STEP_LOGS/notes"
  fi
fi
summarize

# ------------------------------------------------------------------ training
train_command() {  # train_command RUN [--set ...]: the shipped Llama 4x5 through the deepspeed launcher
  local run=$1
  shift
  TRAIN_CMD=(deepspeed --num_gpus 1 --master_port "$(free_port)" pretrain_loop.py --config examples/llama_4x5.yaml
             "${TRAIN_SIZE[@]}" --set "train.micro_batch_size=$MICRO"
             --set "train.global_batch_size=$(( MICRO * ACCUMULATION ))" --set "train.max_steps=$TRAIN_STEPS"
             --set train.train_tokens=null --set train.save_final=false --set "train.save_interval=$SAVE_INTERVAL"
             --set train.eval_interval=0 --set train.log_interval=1 --set "train.output_dir=$WORK/runs/$run"
             --set "data.train_prefixes=[$DATA/corpus]" --set "data.valid_prefixes=[]"
             --set "data.tokenizer=$DATA/tokenizer" --set logging.wandb_project=null
             --set logging.progress_bar=false "${LOSS_SET[@]}" "$@")
}

keep_metrics() {  # keep_metrics RUN FILE: the run's metrics.jsonl into OUT_DIR (also after a timeout)
  [ -f "$WORK/runs/$1/metrics.jsonl" ] && cp "$WORK/runs/$1/metrics.jsonl" "$OUT/$2"
  summarize
}

if enough_time headline 60; then
  train_command headline
  train_step headline 330 "${TRAIN_CMD[@]}"
  keep_metrics headline headline.jsonl
fi

if [ "$(step_status headline)" = ok ]; then
  if enough_time train-per_loop 90; then
    train_command train-per_loop --set model.recompute=per_loop
    train_step train-per_loop 150 "${TRAIN_CMD[@]}"
    keep_metrics train-per_loop second.jsonl
  fi
elif [ "$TRAIN_FAILED" = headline ]; then  # the diagnostic run: does the path work without inductor?
  if enough_time train-eager 90; then
    train_command train-eager --set model.compile=false
    gs_log "train-eager: the headline failed; the same run without compiled blocks (the one run after a failure)"
    run_step train-eager 150 "${TRAIN_CMD[@]}"
    keep_metrics train-eager second.jsonl
  fi
fi

# ------------------------------------------------------------------ loss bench (no training: runs after a failure too)
run_step loss 75 "$PY" tools/bench.py --mode loss --families llama,qwen "${LOSS_BENCH[@]}" --json "$OUT/loss.json"

awk -F'\t' '$2 == "failed" || $2 == "timed out" { bad = 1 } END { exit !bad }' "$STEPS_TSV" && finish 1
finish 0
