#!/usr/bin/env bash
# A paper study at toy scale on CPU (docs/REPRODUCE.md): the CPU twins of a study of the registry
# (megatron_loop/registry/) trained on the bundled corpus, exported, swept over r (bundled
# lm-eval tasks + held-out loss), compared in shared plots, and probed when the study is a
# geometry figure.
#
#   bash tools/small_study.sh [STUDY]     # default: toy (BaseLoop 2x3, CoreLoop 0+1x5+1, 2x3 + H + LG, NonLoop 6x1)
#   bash tools/small_study.sh finding     # knowledge vs reasoning: NonLoop 2x1, BaseLoop 2x3, NonLoop 6x1, 3 seeds
#   bash tools/small_study.sh --list      # the studies (paper figure/table, runs)
#
# Knobs (environment): STUDY_RUN (output folder; runs/study for toy, runs/study_STUDY otherwise),
# STUDY_STEPS (the study's steps: 400 unless it sets its own), STUDY_LIMIT (lm-eval items per task,
# 300), STUDY_JOBS (trainings at once, 1).
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
eval "$(python tools/generate_configs.py --study "$STUDY" --toy-env)"  # STUDY_CORPUS_ARGS STUDY_TASKS ...
STEPS=${STUDY_STEPS:-$STUDY_DEFAULT_STEPS}
LIMIT=${STUDY_LIMIT:-300}
JOBS=${STUDY_JOBS:-1}
[ -z "$STUDY_TASKS" ] || LOCAL_TASKS=$STUDY_TASKS
mkdir -p "$RUN"
PLAN=$(python tools/generate_configs.py --study "$STUDY" --toy-dir "$RUN")  # NAME CONFIG LOOPS PROBE_LOOPS
step "study $STUDY: $(echo "$PLAN" | cut -f1 | tr '\n' ' ')"
# shellcheck disable=SC2086  # the corpus flags are words
[ -f "$RUN/data/corpus.idx" ] || prepare_data "$RUN" $STUDY_CORPUS_ARGS

start=$(date +%s)
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
