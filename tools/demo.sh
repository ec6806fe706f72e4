#!/usr/bin/env bash
# `make demo`: the whole LoopLM pipeline on the bundled corpus, on CPU in a few minutes
# (the GPU when there is one): corpus -> tokenizer -> indexed data -> DeepSpeed training of a
# tiny LoopLM with history injection + Loop Gating -> HF export -> loop sweep r = 1..2K
# (lm-eval on the bundled knowledge and reasoning items, by depth, + held-out loss) -> geometry probes ->
# plots and a results JSON.
#
# Knobs (environment): DEMO_RUN (output folder, default runs/demo), DEMO_STEPS (training
# steps, default 600), DEMO_CONFIG (default examples/tiny_2x3_hist_lg.yaml), DEMO_LIMIT
# (lm-eval items per task, default 120), DEMO_CORPUS (tools/make_corpus.py flags), DEMO_LR.
#
# The demo folder is relocatable: copy or move it and the copy's export, loop sweep and resume read
# the copy (the lm-eval task YAMLs name their items relative to their folder, the checkpoint's run
# config records its paths relative to the folder too; docs/EVALUATION.md, README "Run folders").
#
# Sized so that a 0.35M-parameter model learns one reasoning task within minutes on CPU: the
# reasoning documents have depths 1-2 (held-out items 1-3, so depth 3 is beyond the training
# depths), less prose, no follow-up questions, and a peak lr of 1e-2 for 600 steps. Measured
# (docs/REPRODUCE.md, demo section): the CLUTRR-style task well above chance at r = K, not at
# r = 1; with the bundled defaults (depths 1-4, 300 steps, lr 3e-3) every task stayed at chance.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/pipeline.sh

RUN=${DEMO_RUN:-runs/demo}
STEPS=${DEMO_STEPS:-600}
CONFIG=${DEMO_CONFIG:-examples/tiny_2x3_hist_lg.yaml}
LIMIT=${DEMO_LIMIT:-120}
CORPUS=${DEMO_CORPUS:---prose-docs 1000 --train-max-depth 2 --eval-max-depth 3}
LR=${DEMO_LR:-1e-2}
K=$(train_loops "$CONFIG")
LOOPS=$(python -c "print(','.join(str(r) for r in range(1, 2 * $K + 1)))")

rm -rf "$RUN"
mkdir -p "$RUN"
# shellcheck disable=SC2086  # CORPUS is a list of flags
prepare_data "$RUN" $CORPUS
train_model "$RUN" model "$STEPS" deepspeed "$CONFIG" --set "train.lr=$LR"
export_and_eval "$RUN" model "$LOOPS" "$LIMIT"

step "geometry probes (App. C.4)"
python tools/probe_geometry.py --checkpoint "$RUN/model/train/checkpoints" --valid-prefix "$RUN/data/corpus_valid" \
    --loops "1,$K,$(( 2 * K ))" --num-sequences 8 --num-positions all --seq-length 128 \
    --interaction-sources beyond_training --label "demo $(basename "$CONFIG" .yaml)" --output "$RUN/model/probe" --no-progress

python - "$RUN" <<'PY'
import json, sys
from pathlib import Path
from megatron_loop.atomic import write_atomic
from megatron_loop.eval.report import format_table, read_results
run = Path(sys.argv[1])
results = read_results(run / "model" / "eval" / "results.json")
metrics = [json.loads(line) for line in (run / "model" / "train" / "metrics.jsonl").open()]
# Validation loss during training (held-out split, nats/token) at each eval step, per loop count r.
curve = {m["step"]: {k[len("val_loss_r"):]: v for k, v in m.items() if k.startswith("val_loss_r")}
         for m in metrics if m.get("event") == "eval"}
# Paths relative to the demo folder, so a copy of it describes itself (written_in: where this ran).
summary = {
    "written_in": str(run.resolve()),
    "checkpoint": "model/train/checkpoints",
    "hf_export": "model/hf",
    "layout": results["layout"],
    "effective_depth": results["effective_depth"],
    **{key: results[key] for key in ("groups", "groups_stderr", "groups_chance", "tasks", "tasks_stderr",
                                     "chance", "per_depth")},
    "heldout_loss": {r: v["loss"] for r, v in results.get("heldout", {}).items()},
    "validation_loss_curve": curve,
    "probe": "model/probe/geometry.json",
    "plots": sorted(str(p.relative_to(run)) for p in run.rglob("*.png")),
}
write_atomic(run / "demo_results.json", json.dumps(summary, indent=2))

print(f"\nDemo finished: {results['layout']} LoopLM, trained at K = {results['train_loops']}. Outputs in", run.resolve())
print("\nHeld-out loss (validation split, nats/token) during training, by loop count r:")
rs = sorted({r for row in curve.values() for r in row}, key=int)
print("  step " + "".join(f"{'r=' + r:>9}" for r in rs))
for step, row in sorted(curve.items()):
    print(f"  {step:>4} " + "".join(f"{row[r]:>9.3f}" if r in row else " " * 9 for r in rs))
print(f"\nKnowledge (facts), Reasoning (clutrr, proofwriter, bbh = tracking) and Overall vs L(r): accuracy (%) "
      f"± standard error on {results['limit']} items per task (tasks: the sweep's table above); chance = mean "
      "1/#choices of those items")
print(format_table({**results, "tasks": {}, "heldout": {}}))  # the group rows
print("  results JSON:", run / "demo_results.json")
for p in summary["plots"]:
    print("  plot:", run / p)
PY
