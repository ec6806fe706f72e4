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
# depths), less prose, no follow-up questions, and a peak lr of 1e-2 for 600 steps. What it
# printed is recorded in docs/demo_reference.json, and the README's and docs/REPRODUCE.md's demo
# numbers are generated from it (python tools/demo_docs.py --record RUN SHORT_RUN rewrites both;
# tests/integration/tools/test_demo.py fails when the shortened demo prints other numbers).
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
# the run is named "demo" (logging.wandb_run_name: training's label, the export's and the figures' name)
train_model "$RUN" model "$STEPS" deepspeed "$CONFIG" --set "train.lr=$LR" --set "logging.wandb_run_name=demo"
export_and_eval "$RUN" model "$LOOPS" "$LIMIT"

step "geometry probes (App. C.4)"
# windows of the run's train.seq_length (the probe's default), every position of 8 of them
python tools/probe_geometry.py --checkpoint "$RUN/model/train/checkpoints" --valid-prefix "$RUN/data/corpus_valid" \
    --loops "1,$K,$(( 2 * K ))" --num-sequences 8 --num-positions all \
    --interaction-sources beyond_training --output "$RUN/model/probe" --no-progress

# CPU time of every process the demo ran (bash's `times`: the shell's, then its children's user and system
# time): unlike the wall time, it does not grow with the other jobs of a shared machine
times > "$RUN/.times"
python - "$RUN" "$SECONDS" "$CONFIG" "$STEPS" "$LIMIT" "$LR" "$CORPUS" <<'PY'
import json, re, sys
from pathlib import Path
from megatron_loop.atomic import write_atomic
from megatron_loop.checkpoint.folders import load_run_config
from megatron_loop.eval.report import format_table, read_results
from megatron_loop.plan import count_parameters
run, wall = Path(sys.argv[1]), int(sys.argv[2])
config, steps, limit, lr, corpus = sys.argv[3:8]
times = run / ".times"
cpu = sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", times.read_text().splitlines()[-1]))
times.unlink()
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
    # what ran, and how long (docs/demo_reference.json records these for the docs: tools/demo_docs.py)
    "settings": {"config": config, "steps": int(steps), "limit": int(limit), "lr": lr, "corpus": corpus},
    "params": count_parameters(load_run_config(run / "model" / "train" / "checkpoints").model).total,
    "wall_time_s": wall,
    "cpu_time_s": round(cpu, 1),
    "training_wall_time_s": next((m["wall_time_s"] for m in metrics if m.get("event") == "summary"), None),
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
print(f"One training seed and {results['limit']} items per task: which tasks the model learned at r = K, not a direction "
      "over r (docs/REPRODUCE.md, demo section).")
print(f"  wall time: {wall // 60} min {wall % 60} s; CPU time of all its processes: {cpu / 60:.1f} min")
print("  results JSON:", run / "demo_results.json")
for p in summary["plots"]:
    print("  plot:", run / p)
PY
