#!/usr/bin/env bash
# The second GPU session: every GPU target of docs/BENCHMARKS.md that tools/gpu_first.sh (the first
# session: the Llama 4x5 headline, the kernel check, the loss bench) leaves, in ONE markdown report.
#
#   bash tools/gpu_report.sh OUT_DIR             # one H100/H200 (carry .gpu: tools/gpu_wheels.sh): under 9 minutes
#   bash tools/gpu_report.sh OUT_DIR --smoke     # CPU, tiny sizes, the same steps (a test runs it)
#
# OUT_DIR (new or empty) receives REPORT.md (device, torch, commit, date; tables of tokens/s, MFU, step
# time, peak memory, host syncs and the ratio of each figure to its target, each beside the device it
# came from and, for the training runs, the checkpointing plan they logged), artifacts.tar.gz (every
# step's log and JSON, the runs' metrics.jsonl) and the working files. At most 8 files come back from
# the device's $OUT: write OUT_DIR in /tmp and copy REPORT.md and artifacts.tar.gz there. On a copy of
# the repository without .git, set GPU_REPORT_COMMIT to the commit it is.
#
# Steps, in this order (each under its own limit that ends its whole process tree, tools/gpu_steps.sh):
#   install     the kit's wheels (.gpu/whl) into a folder on PYTHONPATH (tools/gpu_env.sh install)
#   preamble    real imports of the training path, versions, nvidia-smi, df -h (tools/gpu_env.sh check);
#               a failure ends the report at once (exit 2), the failed import named
#   data        the corpus carried in .gpu/data (tools/gpu_wheels.sh) or GPU_REPORT_DATA, else built:
#               generated corpus (tools/make_corpus.py) -> byte-level BPE tokenizer trained on it
#               (tools/train_tokenizer.py --vocab-size 2048) -> indexed dataset
#   train-*     the shipped examples/qwen_4x7.yaml through the deepspeed launcher on that data,
#               GPU_REPORT_TRAIN_STEPS steps (12), global batch = the config's micro-batch x
#               GPU_REPORT_ACCUMULATION (2: fp32 gradient accumulation runs), no final checkpoint
#               (train.save_final=false): as shipped (checkpointing auto) and with per_loop. Fail-fast:
#               after a failed training run the next one is skipped (the benchmarks still run).
#               The Llama 4x5 runs are tools/gpu_first.sh's (GPU_REPORT_ONLY=train-llama,... runs them here)
#   ckpt        checkpointing modes at micro-batch 38 (the paper's), none at micro-batch 8 as reference
#   peers       our step vs HF transformers Llama at equal widths/depth/micro-batch, eager and compiled
#   recompute   recompute cost of selective and per_loop loops, in loop forwards (the auto planner's unit)
#   profile     torch.profiler table of one step of the shipped Llama 4x5 model
#   kept        loop vs NonLoop, recompiles across r and the Muon share (targets kept from earlier rounds)
# The whole run is bounded by GPU_REPORT_BUDGET_S (default 540 s; a step that would start with less
# than 20 s left is skipped); a step that fails or runs out of time is reported as such and the rest
# still run. GPU_REPORT_ONLY=id,id,... runs only those steps (install and preamble always run).
# Exit status: 0 when every step that ran succeeded, 1 otherwise (the report is written either way),
# 2 on bad usage or a failed preamble.
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
KIT=${GPU_KIT:-$ROOT/.gpu}
BUDGET=${GPU_REPORT_BUDGET_S:-$([ $SMOKE = 1 ] && echo 900 || echo 540)}
START=$(date +%s)
RESERVE=20      # seconds kept for the report (and a killed step's grace period)
MIN_STEP_S=20   # a step is not started with less time than this left
STEPS_TSV=$OUT/steps.tsv
STEP_LOGS=$OUT/logs
GS_NAME=gpu_report
GS_STREAM=$([ $SMOKE = 1 ] && echo 0 || echo 1)  # on the device the output tail shows the step running
GPU_STEPS_ONLY=${GPU_REPORT_ONLY:-}
[ -z "$GPU_STEPS_ONLY" ] || GPU_STEPS_ONLY="install,preamble,$GPU_STEPS_ONLY"
# shellcheck source=tools/gpu_steps.sh
source "$ROOT/tools/gpu_steps.sh"
: > "$STEPS_TSV"

if [ $SMOKE = 1 ]; then
  DEVICE=cpu
  CAP_SCALE=3   # a loaded 2-core CI machine; the first DeepSpeed launch also JIT-builds its CPU shm op
  CHECK=()
  CORPUS=(--prose-docs 200 --reasoning-docs-per-task 50 --valid-docs 2 --eval-items-per-depth 1)
  WORKERS=1
  TRAIN_STEPS=${GPU_REPORT_TRAIN_STEPS:-3}
  SKIP_STEPS=1  # steps left out of the medians (compilation, allocator warm-up)
  # the shipped configs at CPU widths (the same block structure), short sequences
  TRAIN_MICRO=2
  TRAIN_SIZE=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_attention_heads=2
              --set model.num_key_value_heads=1 --set model.head_dim=32 --set model.vocab_size=2048
              --set model.rope_scaling=null --set train.seq_length=32 --set train.micro_batch_size=$TRAIN_MICRO
              --set logging.peak_tflops=0.05)  # a declared CPU peak: training logs MFU only against a known one
  BENCH=(--device cpu --steps 1 --warmup 0 --seq 16)
  MB_SMALL=1 MB_PAPER=2 TOP=8
  COMPILE=() CKPT_BUDGET=() KEPT_MODES=loop-vs-nonloop,optimizer
else
  DEVICE=cuda
  CAP_SCALE=1
  CHECK=(--cuda)
  CORPUS=(--prose-docs 4000 --reasoning-docs-per-task 1500 --valid-docs 10 --eval-items-per-depth 1)
  WORKERS=8
  TRAIN_STEPS=${GPU_REPORT_TRAIN_STEPS:-12}
  SKIP_STEPS=3
  TRAIN_MICRO=  # the config's own
  TRAIN_SIZE=()
  BENCH=(--device cuda --steps 6 --warmup 2)
  MB_SMALL=8 MB_PAPER=38 TOP=15
  COMPILE=(--compile) CKPT_BUDGET=(--ac-budget-gib 50) KEPT_MODES=loop-vs-nonloop,compile,optimizer
fi
ACCUMULATION=${GPU_REPORT_ACCUMULATION:-2}

gs_log "report of $DEVICE ($([ $SMOKE = 1 ] && echo 'CPU smoke: tiny sizes' || echo 'GPU')) into $OUT; budget $BUDGET s"

# ------------------------------------------------------------------ install, preamble (a failure ends the report)
export GPU_SITE=$OUT/site
if [ -d "$KIT/whl" ] && { [ $SMOKE = 0 ] || [ -n "${GPU_KIT:-}" ]; }; then
  if ! run_step install 90 bash tools/gpu_env.sh install "$KIT"; then
    echo "error: the wheel kit did not install (its log: $STEP_LOGS/install.log):" >&2
    tail -5 "$STEP_LOGS/install.log" >&2
    exit 2
  fi
else
  record install "skipped: no kit at $KIT/whl; the packages already installed are used" "" 0 0 ""
fi
eval "$(bash tools/gpu_env.sh exports)"
if ! run_step preamble 45 bash tools/gpu_env.sh check "${CHECK[@]}"; then  # the failed import, then what to do
  failed=$(grep '^error:' "$STEP_LOGS/preamble.log" | tail -1)
  module=$(sed -n 's/^error: import \([^ ]*\) failed:.*/\1/p' <<< "$failed")
  echo "${failed:-error: the preamble failed (its log: $STEP_LOGS/preamble.log)}" >&2
  echo "error: ${module:-the training path}: missing for $PY; on the GPU machine run 'source .gpu/device_env.sh' first (the kit: tools/gpu_wheels.sh)" >&2
  exit 2
fi
if [ $SMOKE = 1 ]; then
  "$PY" -c "import sys; sys.path.insert(0, 'tools'); from benchmarks.tables import cpu_name; print(cpu_name())" \
      > "$STEP_LOGS/device.txt" 2>/dev/null || echo CPU > "$STEP_LOGS/device.txt"
else
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 > "$STEP_LOGS/device.txt"
fi

# ------------------------------------------------------------------ data
DATA=${GPU_REPORT_DATA:-$KIT/data}
if prepared_data "$DATA"; then
  gs_log "data: the prepared corpus $DATA"
  record data ok 0 0 0 "prepared: $DATA"
else
  DATA=$OUT/data
  data_step 120 "$DATA" "$OUT" "$WORKERS" "${CORPUS[@]}" || TRAIN_FAILED=data
fi

config_micro_batch() { "$PY" -c "import sys; from megatron_loop.config import load_config; print(load_config(sys.argv[1]).train.micro_batch_size)" "$1"; }

train_run() {  # train_run ID CONFIG CAP_S [--set ...]: the shipped config through the deepspeed launcher
  local id=$1 config=$2 cap=$3
  shift 3
  local micro=$TRAIN_MICRO
  [ -n "$micro" ] || micro=$(config_micro_batch "$config") || micro=1
  train_step "$id" "$cap" deepspeed --num_gpus 1 --master_port "$(free_port)" pretrain_loop.py --config "$config" \
      "${TRAIN_SIZE[@]}" --set "train.max_steps=$TRAIN_STEPS" --set train.train_tokens=null \
      --set "train.global_batch_size=$(( micro * ACCUMULATION ))" --set "train.output_dir=$OUT/runs/$id" \
      --set train.save_final=false --set train.save_interval=1000000 --set train.eval_interval=0 \
      --set train.log_interval=1 --set "data.train_prefixes=[$DATA/corpus]" --set "data.valid_prefixes=[]" \
      --set "data.tokenizer=$DATA/tokenizer" --set logging.wandb_project=null --set logging.progress_bar=false "$@"
}

bench() {  # bench ID CAP_S ARGS...: one tools/bench.py run writing OUT_DIR/ID.json
  local id=$1 cap=$2
  shift 2
  run_step "$id" "$cap" "$PY" tools/bench.py "${BENCH[@]}" "$@" --json "$OUT/$id.json"
}

FAILED=0
if [ -n "${GPU_REPORT_ONLY:-}" ] && selected train-llama; then  # the first session's runs, on request
  train_run train-llama examples/llama_4x5.yaml 150 || FAILED=1
  train_run train-llama-per_loop examples/llama_4x5.yaml 110 --set model.recompute=per_loop || FAILED=1
fi
train_run train-qwen examples/qwen_4x7.yaml 150 || FAILED=1
train_run train-qwen-per_loop examples/qwen_4x7.yaml 110 --set model.recompute=per_loop || FAILED=1
bench ckpt 90 --mode checkpointing "${COMPILE[@]}" --families llama --loops 5 --micro-batch $MB_PAPER \
    --ac-modes none,per_loop,selective,auto --ac-reference-micro-batch $MB_SMALL "${CKPT_BUDGET[@]}" || FAILED=1
bench peers 150 --mode peers "${COMPILE[@]}" --families llama --micro-batch $MB_SMALL || FAILED=1
bench recompute 60 --mode recompute "${COMPILE[@]}" --families llama --loops 5 --micro-batch $MB_SMALL || FAILED=1
bench profile 60 --mode profile "${COMPILE[@]}" --config examples/llama_4x5.yaml --micro-batch $MB_SMALL \
    --top $TOP || FAILED=1
bench kept 120 --mode $KEPT_MODES "${COMPILE[@]}" --families llama --micro-batch $MB_SMALL --accumulation 2 || FAILED=1  # the Muon share at G = 1824 is extrapolated from t_opt and t_seq
if [ $SMOKE = 1 ]; then  # what CPU cannot run in a test's time, listed so the report says so
  record peers-compiled "skipped on CPU: inductor compiles take minutes on CPU (the peers step runs eager only)" "" 0 0 ""
  record kept-compile "skipped on CPU: inductor compiles take minutes on CPU (recompiles across r: tests/unit/parallel/test_parallelize.py)" "" 0 0 ""
fi
awk -F'\t' '$2 == "failed" || $2 == "timed out" { bad = 1 } END { exit !bad }' "$STEPS_TSV" && FAILED=1

"$PY" tools/bench_report.py "$OUT" --skip-steps $SKIP_STEPS --budget-s "$BUDGET" --started "$START" \
    $([ $SMOKE = 1 ] && echo --smoke) || FAILED=1
# shellcheck disable=SC2046
tar -czf "$OUT/artifacts.tar.gz.tmp" -C "$OUT" --exclude='global_step*' --exclude='zero_to_*.py' steps.tsv logs runs $(cd "$OUT" && ls ./*.json 2>/dev/null) \
    && mv "$OUT/artifacts.tar.gz.tmp" "$OUT/artifacts.tar.gz"
gs_log "report: $OUT/REPORT.md ($(( $(date +%s) - START )) s)"
exit $FAILED
