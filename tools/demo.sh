#!/usr/bin/env bash
# `make demo`: the whole LoopLM pipeline on the bundled corpus, on CPU in a few minutes
# (the GPU when there is one): corpus -> tokenizer -> indexed data -> DeepSpeed training of a
# tiny LoopLM with history injection + Loop Gating -> HF export -> loop sweep (lm-eval on the
# bundled reasoning items + held-out loss) -> geometry probes -> plots and results JSON.
#
# Knobs (environment): DEMO_RUN (output folder, default runs/demo), DEMO_STEPS (training
# steps, default 300), DEMO_CONFIG (default examples/tiny_2x3_hist_lg.yaml), DEMO_LIMIT
# (lm-eval items per task, default 120).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=${DEMO_RUN:-runs/demo}
STEPS=${DEMO_STEPS:-300}
CONFIG=${DEMO_CONFIG:-examples/tiny_2x3_hist_lg.yaml}
LIMIT=${DEMO_LIMIT:-120}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PORT=$(python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
K=$(python - "$CONFIG" <<'PY'
import sys
from megatron_loop.config import load_config
print(load_config(sys.argv[1]).model.train_loops)
PY
)
LOOPS=$(python -c "print(','.join(str(r) for r in range(1, 2 * $K + 1)))")
step() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

rm -rf "$RUN"
mkdir -p "$RUN"

step "1/7 generate the bundled corpus (prose + depth-controlled reasoning, held-out lm-eval items)"
python tools/make_corpus.py --output-dir "$RUN/corpus" --seed 0

step "2/7 train a byte-level BPE tokenizer"
python tools/train_tokenizer.py --input "$RUN/corpus/train.jsonl" --output "$RUN/tokenizer" --vocab-size 2048

step "3/7 tokenise into Megatron indexed datasets (EOS appended, no BOS; held-out validation prefix)"
python tools/preprocess_data.py --input "$RUN/corpus/train.jsonl" --tokenizer "$RUN/tokenizer" \
    --output-prefix "$RUN/data/corpus" --workers 2 --validation-documents 300 --no-progress

step "4/7 train $CONFIG for $STEPS steps with the deepspeed launcher"
deepspeed --num_gpus 1 --master_port "$PORT" pretrain_loop.py --config "$CONFIG" \
    --set "train.output_dir=$RUN/train" --set "train.max_steps=$STEPS" \
    --set "train.save_interval=$STEPS" --set "train.eval_interval=$(( STEPS / 3 > 0 ? STEPS / 3 : 1 ))" \
    --set "data.train_prefixes=[$RUN/data/corpus]" --set "data.valid_prefixes=[$RUN/data/corpus_valid]" \
    --set "data.tokenizer=$RUN/tokenizer" --set "logging.progress_bar=false"

step "5/7 export the checkpoint to Hugging Face"
python tools/convert_to_hf.py --checkpoint "$RUN/train/checkpoints" --output "$RUN/hf"

step "6/7 loop sweep r = $LOOPS: bundled reasoning tasks by depth + held-out loss"
python tools/eval_loops.py --model "$RUN/hf" --loops "$LOOPS" \
    --include-path "$RUN/corpus/eval" \
    --tasks looplm_clutrr_local,looplm_proofwriter_local,looplm_tracking_local \
    --limit "$LIMIT" --valid-prefix "$RUN/data/corpus_valid" --seq-length 128 --output "$RUN/eval"

step "7/7 geometry probes (App. A.4)"
python tools/probe_geometry.py --checkpoint "$RUN/train/checkpoints" --valid-prefix "$RUN/data/corpus_valid" \
    --loops "1,$K,$(( 2 * K ))" --num-sequences 8 --num-positions 800 --seq-length 128 \
    --interaction-sources beyond_training --output "$RUN/probe" --no-progress

python - "$RUN" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
summary = {
    "run": str(run.resolve()),
    "checkpoint": str(run / "train" / "checkpoints"),
    "hf_export": str(run / "hf"),
    "eval": json.loads((run / "eval" / "results.json").read_text()).get("summary", {}),
    "plots": sorted(str(p) for p in run.rglob("*.png")),
    "probe": str(run / "probe" / "geometry.json"),
}
(run / "demo_results.json").write_text(json.dumps(summary, indent=2))
print("\nDemo finished. Outputs in", run.resolve())
print("  results:", run / "demo_results.json")
for p in summary["plots"]:
    print("  plot:   ", p)
PY
