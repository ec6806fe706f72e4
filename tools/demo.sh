#!/usr/bin/env bash
# `make demo`: the whole LoopLM pipeline on the bundled corpus, on CPU in a few minutes
# (the GPU when there is one): corpus -> tokenizer -> indexed data -> DeepSpeed training of a
# tiny LoopLM with history injection + Loop Gating -> HF export -> loop sweep r = 1..2K
# (lm-eval on the bundled reasoning items by depth + held-out loss) -> geometry probes ->
# plots and a results JSON.
#
# Knobs (environment): DEMO_RUN (output folder, default runs/demo), DEMO_STEPS (training
# steps, default 300), DEMO_CONFIG (default examples/tiny_2x3_hist_lg.yaml), DEMO_LIMIT
# (lm-eval items per task, default 120).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

RUN=${DEMO_RUN:-runs/demo}
STEPS=${DEMO_STEPS:-300}
CONFIG=${DEMO_CONFIG:-examples/tiny_2x3_hist_lg.yaml}
LIMIT=${DEMO_LIMIT:-120}
K=$(train_loops "$CONFIG")
LOOPS=$(python -c "print(','.join(str(r) for r in range(1, 2 * $K + 1)))")

rm -rf "$RUN"
mkdir -p "$RUN"
prepare_data "$RUN"
train_model "$RUN" model "$STEPS" deepspeed "$CONFIG"
export_and_eval "$RUN" model "$LOOPS" "$LIMIT"

step "geometry probes (App. A.4)"
python tools/probe_geometry.py --checkpoint "$RUN/model/train/checkpoints" --valid-prefix "$RUN/data/corpus_valid" \
    --loops "1,$K,$(( 2 * K ))" --num-sequences 8 --num-positions 800 --seq-length 128 \
    --interaction-sources beyond_training --output "$RUN/model/probe" --no-progress

python - "$RUN" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
results = json.loads((run / "model" / "eval" / "results.json").read_text())
summary = {
    "run": str(run.resolve()),
    "checkpoint": str(run / "model" / "train" / "checkpoints"),
    "hf_export": str(run / "model" / "hf"),
    "layout": results["layout"],
    "effective_depth": results["effective_depth"],
    "groups": results["groups"],
    "tasks": results["tasks"],
    "heldout_loss": {r: v["loss"] for r, v in results.get("heldout", {}).items()},
    "probe": str(run / "model" / "probe" / "geometry.json"),
    "plots": sorted(str(p) for p in run.rglob("*.png")),
}
(run / "demo_results.json").write_text(json.dumps(summary, indent=2))
print("\nDemo finished. Outputs in", run.resolve())
print("  results JSON:", run / "demo_results.json")
print("  held-out loss by r:", {r: round(l, 3) for r, l in summary["heldout_loss"].items()})
for p in summary["plots"]:
    print("  plot:", p)
PY
