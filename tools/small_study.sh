#!/usr/bin/env bash
# A paper study at toy scale on CPU (docs/REPRODUCE.md): the CPU twins of a study of the registry
# (megatron_loop/registry/) trained on the bundled corpus, exported, swept over r (bundled
# lm-eval tasks + held-out loss), compared in shared plots, and probed when the study is a
# geometry figure.
#
#   bash tools/small_study.sh [STUDY]     # default: toy (BaseLoop 2x3, CoreLoop 0+1x5+1, 2x3 + H + LG, NonLoop 6x1)
#   bash tools/small_study.sh finding1    # knowledge vs reasoning at L(K): NonLoop 2x1, BaseLoop 2x3, NonLoop 6x1, 3 seeds
#   bash tools/small_study.sh finding1_paired   # the first finding as the paper measures it (paired, r = K -> 2K)
#   bash tools/small_study.sh --list      # the studies (paper figure/table, runs)
#
# Knobs (environment): STUDY_RUN (output folder; runs/study for toy, runs/study_STUDY otherwise),
# STUDY_STEPS (the study's steps: 400 unless it sets its own), STUDY_LIMIT (lm-eval items per task,
# 300), STUDY_JOBS (trainings at once, 1; a paired study: 2), STUDY_CORPUS_EXTRA (make_corpus.py
# flags appended to the study's, e.g. smaller sizes), STUDY_ONLY_MODELS / STUDY_ONLY_SEEDS (a subset
# of the twins / seeds, space-separated: smoke tests and partial reruns).
# A paired study (registry Study.paired) trains, exports and sweeps each twin and seed in one job
# (tools/paired_study.py eval: every item's outcome at every r = 1..2K, held-out loss), then
# analyses them by the pre-registered plan (tools/paired_study.py analyse: RUN/summary.{md,json},
# RUN/paired_*.png).
# A twin has the tiny backbone of its family and the run's p/s/K/c and conditioning, unless the
# study defines scaled layouts (toy: physical depth 2, L(K) = 6); its config is written to
# STUDY_RUN/configs/NAME.yaml by tools/generate_configs.py. A study with seeds trains every twin
# once per seed (NAME-seedS) and ends with tools/seed_study.py: mean ± standard error over seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

STUDY=${1:-toy}
if [ "$STUDY" = --list ]; then
  python tools/generate_configs.py --list-studies | cut -f1-4
  exit 0
fi
if [ "$STUDY" = toy ]; then RUN=${STUDY_RUN:-runs/study}; else RUN=${STUDY_RUN:-runs/study_$STUDY}; fi
# an unknown study: generate_configs.py's error line and its exit code 2, not an empty eval and a later failure
toy_env=$(python tools/generate_configs.py --study "$STUDY" --toy-env) || exit $?
eval "$toy_env"  # STUDY_CORPUS_ARGS STUDY_TASKS ...
STEPS=${STUDY_STEPS:-$STUDY_DEFAULT_STEPS}
LIMIT=${STUDY_LIMIT:-300}
if [ -n "$STUDY_PAIRED" ]; then JOBS=${STUDY_JOBS:-2}; else JOBS=${STUDY_JOBS:-1}; fi
# the knobs checked before any data is built (STUDY_STEPS=abc failed after it, as an unbound variable)
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "error: STUDY_STEPS='$STEPS': expected a positive integer (training steps per run)" >&2; exit 2; }
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "error: STUDY_JOBS='$JOBS': expected a positive integer (trainings at once)" >&2; exit 2; }
[[ $LIMIT =~ ^([1-9][0-9]*|0?\.[0-9]*[1-9][0-9]*)$ ]] || { echo "error: STUDY_LIMIT='$LIMIT': expected lm-eval items per task (an integer >= 1) or a fraction in (0, 1)" >&2; exit 2; }
[ -z "$STUDY_TASKS" ] || LOCAL_TASKS=$STUDY_TASKS
mkdir -p "$RUN"
PLAN=$(python tools/generate_configs.py --study "$STUDY" --toy-dir "$RUN")  # NAME CONFIG LOOPS PROBE_LOOPS
if [ -n "${STUDY_ONLY_MODELS:-}${STUDY_ONLY_SEEDS:-}" ]; then  # NAME or NAME-seedS: keep the subset asked for
  PLAN=$(echo "$PLAN" | while IFS=$'\t' read -r name rest; do
    model=${name%-seed*}; seed=${name##*-seed}; [ "$seed" = "$name" ] && seed=
    if { [ -z "${STUDY_ONLY_MODELS:-}" ] || [[ " $STUDY_ONLY_MODELS " == *" $model "* ]]; } &&
       { [ -z "${STUDY_ONLY_SEEDS:-}" ] || [ -z "$seed" ] || [[ " $STUDY_ONLY_SEEDS " == *" $seed "* ]]; }; then
      printf '%s\t%s\n' "$name" "$rest"
    fi
  done)
  [ -n "$PLAN" ] || { echo "error: STUDY_ONLY_MODELS / STUDY_ONLY_SEEDS select no twin of $STUDY" >&2; exit 2; }
fi
step "study $STUDY: $(echo "$PLAN" | cut -f1 | tr '\n' ' ')"
begin=$(date +%s)
# shellcheck disable=SC2086  # the corpus flags are words
[ -f "$RUN/data/corpus.idx" ] || prepare_data "$RUN" $STUDY_CORPUS_ARGS ${STUDY_CORPUS_EXTRA:-}

start=$(date +%s)
if [ -n "$STUDY_PAIRED" ]; then
  # the pre-registered plan as it stood when the first runs started (tools/paired_study.py plan), kept with them
  if [ ! -f "$RUN/plan.txt" ]; then
    { echo "# tools/paired_study.py plan --study $STUDY, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), before the runs below"
      python tools/paired_study.py plan --study "$STUDY"; } > "$RUN/plan.txt.tmp"
    mv "$RUN/plan.txt.tmp" "$RUN/plan.txt"
  fi
  # one job per twin and seed: train, export, every item at every r (two jobs at a time by default)
  paired_job() {
    local name=$1 config=$2 loops=$3
    train_model "$RUN" "$name" "$STEPS" python "$config" &&
    python tools/convert_to_hf.py --checkpoint "$RUN/$name/train/checkpoints" --output "$RUN/$name/hf" &&
    python tools/paired_study.py eval --model "$RUN/$name/hf" --loops "$loops" --include-path "$RUN/corpus/eval" \
        --tasks "$STUDY_TASKS" --valid-prefix "$RUN/data/corpus_valid" --label "$name" --output "$RUN/$name/paired"
  }
  pids=()
  while IFS=$'\t' read -r name config loops probe; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    step "train, export and sweep $name (r = $loops): $RUN/$name.log"
    paired_job "$name" "$config" "$loops" > "$RUN/$name.log" 2>&1 &
    pids+=($!)
  done <<< "$PLAN"
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || { echo "error: a twin failed; see $RUN/*.log" >&2; exit 1; }
  step "trainings, exports and sweeps done in $(( $(date +%s) - start )) s wall"
  step "paired analysis by the pre-registered plan (tools/paired_study.py plan --study $STUDY)"
  python tools/paired_study.py analyse --study "$STUDY" --run "$RUN" \
      ${STUDY_ONLY_MODELS:+--models "$STUDY_ONLY_MODELS"} ${STUDY_ONLY_SEEDS:+--seeds "$STUDY_ONLY_SEEDS"}
  step "study $STUDY done in $(( $(date +%s) - begin )) s wall, data included"
  exit 0
fi
while IFS=$'\t' read -r name config loops probe; do
  if [ "$JOBS" -gt 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    train_model "$RUN" "$name" "$STEPS" python "$config" > "$RUN/$name.train.log" 2>&1 &
  else
    train_model "$RUN" "$name" "$STEPS" python "$config"
  fi
done <<< "$PLAN"
wait
step "trainings done in $(( $(date +%s) - start )) s wall"

# every twin's sweep; without seeds the last one also draws the others on its figures
compare=()
last=$(echo "$PLAN" | tail -n 1 | cut -f1)
while IFS=$'\t' read -r name config loops probe; do
  if [ "$name" = "$last" ] && [ -z "$STUDY_SEEDS" ]; then
    export_and_eval "$RUN" "$name" "$loops" "$LIMIT" "${compare[@]}"
  else
    export_and_eval "$RUN" "$name" "$loops" "$LIMIT"
    compare+=(--compare "$RUN/$name/eval/results.json")
  fi
  if [ "$probe" != - ]; then
    step "geometry probes of $name at r = $probe (App. C.4)"
    python tools/probe_geometry.py --checkpoint "$RUN/$name/train/checkpoints" --valid-prefix "$RUN/data/corpus_valid" \
        --loops "$probe" --num-sequences 8 --num-positions all --seq-length 128 --output "$RUN/$name/probe" --no-progress
  fi
done <<< "$PLAN"
if [ -n "$STUDY_SEEDS" ]; then
  step "mean ± standard error over seeds $STUDY_SEEDS: $RUN/summary.{md,json}, $RUN/knowledge_reasoning_vs_depth.png"
  python tools/seed_study.py --study "$STUDY" --run "$RUN"
else
  step "figures comparing the study's models: $RUN/$last/eval/*.png"
fi
step "study $STUDY done in $(( $(date +%s) - start )) s wall after the data"
