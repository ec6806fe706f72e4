#!/usr/bin/env bash
# Variable depth at toy scale on CPU (docs/REPRODUCE.md "Variable depth"): the BaseLoop 2x3 of
# examples/tiny_2x3.yaml with channel initial-state injection, trained at equal tokens (a) with the
# paper's fixed K = 3 and full backpropagation and (b) with Poisson-lognormal sampled loop counts
# (mean 3, Huginn's schedule) and backpropagation through the last 2 loops; each exported and
# evaluated at r = 1..3K (bundled reasoning tasks + held-out loss) and under per-token adaptive
# exit with r <= 3K: KL exit on tasks + held-out loss, cosine exit on held-out loss only.
#
#   bash tools/depth_study.sh      # DEPTH_RUN (runs/depth), DEPTH_STEPS (400), DEPTH_LIMIT (100)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

RUN=${DEPTH_RUN:-runs/depth}
STEPS=${DEPTH_STEPS:-400}
LIMIT=${DEPTH_LIMIT:-100}
KL=${DEPTH_KL_THRESHOLDS:-1,0.1,0.01,0.001}
COSINE=${DEPTH_COSINE_THRESHOLDS:-0.03,0.01,0.003,0.001}
LOOPS=1,2,3,4,6,9
mkdir -p "$RUN"
[ -f "$RUN/data/corpus.idx" ] || prepare_data "$RUN"

BASE=(examples/tiny_2x3.yaml --set model.initial_injection=channel)
train_model "$RUN" fixed_k3 "$STEPS" python "${BASE[@]}"
train_model "$RUN" sampled_k3_bp2 "$STEPS" python "${BASE[@]}" \
    --set train.loop_sampling=poisson_lognormal --set train.backprop_loops=2

export_and_eval "$RUN" fixed_k3 "$LOOPS" "$LIMIT" --exit-criterion kl --exit-thresholds "$KL"
export_and_eval "$RUN" sampled_k3_bp2 "$LOOPS" "$LIMIT" --exit-criterion kl --exit-thresholds "$KL" \
    --compare "$RUN/fixed_k3/eval/results.json"
for name in fixed_k3 sampled_k3_bp2; do
  step "$name under cosine exit (held-out loss only)"
  python tools/eval_loops.py --model "$RUN/$name/hf" --loops "$LOOPS" --tasks none \
      --valid-prefix "$RUN/data/corpus_valid" --seq-length 128 --label "$name" \
      --output "$RUN/$name/eval_cosine" --no-progress --exit-criterion cosine --exit-thresholds "$COSINE" \
      $([ "$name" = sampled_k3_bp2 ] && echo --compare "$RUN/fixed_k3/eval_cosine/results.json")
done
step "figures: $RUN/sampled_k3_bp2/eval/{loss_vs_loops,frontier}.png, $RUN/sampled_k3_bp2/eval_cosine/frontier.png"
