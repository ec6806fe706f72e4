#!/usr/bin/env bash
# The paper's comparison at toy scale on CPU (docs/REPRODUCE.md): at matched physical depth 2
# and training effective depth L(K) = 6, BaseLoop 2x3 vs CoreLoop 0+1x5+1 vs BaseLoop 2x3 with
# channel history injection + Loop Gating, against the NonLoop 6x1 reference; each trained on the
# bundled corpus, exported, and swept over r = 1..2K (bundled reasoning tasks + held-out loss).
#
#   bash tools/small_study.sh            # STUDY_RUN (runs/study), STUDY_STEPS (400), STUDY_LIMIT (300)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

RUN=${STUDY_RUN:-runs/study}
STEPS=${STUDY_STEPS:-400}
LIMIT=${STUDY_LIMIT:-300}
mkdir -p "$RUN"
[ -f "$RUN/data/corpus.idx" ] || prepare_data "$RUN"

train_model "$RUN" nonloop_6x1 "$STEPS" python examples/tiny_2x3.yaml --set model.core_layers=6 --set model.train_loops=1
train_model "$RUN" baseloop_2x3 "$STEPS" python examples/tiny_2x3.yaml
train_model "$RUN" coreloop_0+1x5+1 "$STEPS" python examples/tiny_2x3.yaml \
    --set model.core_layers=1 --set model.train_loops=5 --set model.coda_layers=1
train_model "$RUN" baseloop_2x3_hist_lg "$STEPS" python examples/tiny_2x3_hist_lg.yaml

export_and_eval "$RUN" nonloop_6x1 1 "$LIMIT"
export_and_eval "$RUN" baseloop_2x3 1,2,3,4,5,6 "$LIMIT"
export_and_eval "$RUN" coreloop_0+1x5+1 1,2,3,4,5,6,7,8,9,10 "$LIMIT"
export_and_eval "$RUN" baseloop_2x3_hist_lg 1,2,3,4,5,6 "$LIMIT" \
    --compare "$RUN/baseloop_2x3/eval/results.json" --compare "$RUN/coreloop_0+1x5+1/eval/results.json" \
    --compare "$RUN/nonloop_6x1/eval/results.json"
step "figures comparing the four models: $RUN/baseloop_2x3_hist_lg/eval/*.png"
