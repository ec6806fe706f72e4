#!/usr/bin/env bash
# A paper study at toy scale on CPU (docs/REPRODUCE.md): the CPU twins of a study of the registry
# (megatron_loop/registry/) trained on the bundled corpus, exported, swept over r (bundled
# lm-eval tasks + held-out loss), compared in shared plots, and probed when the study is a
# geometry figure.
#
#   bash tools/small_study.sh [STUDY]     # default: toy (BaseLoop 2x3, CoreLoop 0+1x5+1, 2x3 + H + LG, NonLoop 6x1)
#   bash tools/small_study.sh finding1    # knowledge vs reasoning at L(K): NonLoop 2x1, BaseLoop 2x3, NonLoop 6x1, 3 seeds
#   bash tools/small_study.sh finding1_paired   # the first finding as the paper measures it (paired, r = K -> 2K)
#   bash tools/small_study.sh finding1_r2 # a registered study (megatron_loop/studies/, docs/STUDIES.md): findings 1-3
#   bash tools/small_study.sh --list      # the studies (paper figure/table, runs: models x seeds)
#   bash tools/small_study.sh --help      # this text
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
# A registered study (finding1_r2, finding2, finding3) runs the same way between two steps of tools/study.py:
# gate first (the plan must hash to its registration, the checkout must be clean; RUN/provenance.json records
# the commit), finish last (every run's items archived in docs/studies/STUDY.json.gz, analysed from there).
# STUDY_SMOKE=1 runs a registered study's pipeline as a check (tests, tiny sizes): nothing is gated, the
# provenance says smoke, the archive stays in RUN. A paired or registered study resumes: a twin whose RUN/NAME/paired/items.json exists is not run again.
# A twin has the tiny backbone of its family and the run's p/s/K/c and conditioning, unless the
# study defines scaled layouts (toy: physical depth 2, L(K) = 6); its config is written to
# STUDY_RUN/configs/NAME.yaml by tools/generate_configs.py. A study with seeds trains every twin
# once per seed (NAME-seedS) and ends with tools/seed_study.py: mean ± standard error over seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

STUDY=${1:-toy}
case "$STUDY" in
  --list) python tools/generate_configs.py --list-studies | cut -f1-4; exit 0 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "error: unknown option $STUDY; expected a study name, --list or --help" >&2; exit 2 ;;
esac
if [ "$STUDY" = toy ]; then RUN=${STUDY_RUN:-runs/study}; else RUN=${STUDY_RUN:-runs/study_$STUDY}; fi
settings=$(python tools/generate_configs.py --study "$STUDY" --toy-env) || exit 2  # an unknown study: its error line
eval "$settings"  # STUDY_CORPUS_ARGS STUDY_TASKS STUDY_DEFAULT_STEPS STUDY_SEEDS STUDY_PAIRED STUDY_REGISTERED
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
if [ -n "$STUDY_REGISTERED" ]; then  # before anything runs: the registered plan, a clean checkout, the commit
  python tools/study.py gate "$STUDY" --run "$RUN" ${STUDY_SMOKE:+--smoke} || exit 2
fi
begin=$(date +%s)
# shellcheck disable=SC2086  # the corpus flags are words
[ -f "$RUN/data/corpus.idx" ] || prepare_data "$RUN" $STUDY_CORPUS_ARGS ${STUDY_CORPUS_EXTRA:-}

start=$(date +%s)
if [ -n "$STUDY_PAIRED" ]; then
  # the pre-registered plan as it stood when the first runs started (tools/paired_study.py plan), kept with them
  if [ -z "$STUDY_REGISTERED" ] && [ ! -f "$RUN/plan.txt" ]; then  # a registered study's plan is in git (gate)
    { echo "# tools/paired_study.py plan --study $STUDY, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), before the runs below"
      python tools/paired_study.py plan --study "$STUDY"; } > "$RUN/plan.txt.tmp"
    mv "$RUN/plan.txt.tmp" "$RUN/plan.txt"
  fi
  # one job per twin and seed: train, export, every item at every r (two jobs at a time by default)
  paired_job() {
    local name=$1 config=$2 loops=$3 t0
    t0=$(date +%s)
    train_model "$RUN" "$name" "$STEPS" python "$config" &&
    python tools/convert_to_hf.py --checkpoint "$RUN/$name/train/checkpoints" --output "$RUN/$name/hf" &&
    python tools/paired_study.py eval --model "$RUN/$name/hf" --loops "$loops" --include-path "$RUN/corpus/eval" \
        --tasks "$STUDY_TASKS" --valid-prefix "$RUN/data/corpus_valid" --label "$name" --output "$RUN/$name/paired" &&
    echo $(( $(date +%s) - t0 )) > "$RUN/$name/wall_s"  # the run's wall time (tools/study.py finish archives it)
  }
  pids=()
  while IFS=$'\t' read -r name config loops probe; do
    if [ -f "$RUN/$name/paired/items.json" ]; then step "$name: done before (RUN/$name/paired/items.json)"; continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    step "train, export and sweep $name (r = $loops): $RUN/$name.log"
    paired_job "$name" "$config" "$loops" > "$RUN/$name.log" 2>&1 &
    pids+=($!)
  done <<< "$PLAN"
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || { echo "error: a twin failed; see $RUN/*.log" >&2; exit 1; }
  step "trainings, exports and sweeps done in $(( $(date +%s) - start )) s wall"
  if [ -n "$STUDY_REGISTERED" ]; then
    step "archive every run's items (docs/studies/$STUDY.json.gz) and analyse the archive by the registered plan"
    python tools/study.py finish "$STUDY" --run "$RUN"
  else
    step "paired analysis by the pre-registered plan (tools/paired_study.py plan --study $STUDY)"
    python tools/paired_study.py analyse --study "$STUDY" --run "$RUN" \
        ${STUDY_ONLY_MODELS:+--models "$STUDY_ONLY_MODELS"} ${STUDY_ONLY_SEEDS:+--seeds "$STUDY_ONLY_SEEDS"}
  fi
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
