# Shell functions shared by tools/demo.sh and tools/small_study.sh (source this file).
# Each stage is one real CLI of the project; nothing here is a shortcut around them.

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The bundled tasks: recall of the generated facts in the Knowledge group; the reasoning items in the
# paper's reasoning slots (tracking ~ BBH tracking_shuffled_objects).
LOCAL_TASKS="facts,clutrr=looplm_clutrr_local,proofwriter=looplm_proofwriter_local,bbh=looplm_tracking_local"

step() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
free_port() { python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
train_loops() {  # train_loops CONFIG [--set ...]: K of a config after overrides
  python - "$@" <<'PY'
import sys
from megatron_loop.config import load_config
args = sys.argv[2:]
print(load_config(sys.argv[1], [a for a in args if a != "--set"]).model.train_loops)
PY
}

# prepare_data RUN [make_corpus.py flags]: corpus -> tokenizer -> RUN/data/corpus{,_valid}
prepare_data() {
  local run=$1
  shift
  step "generate the bundled corpus (prose, facts, depth-controlled reasoning; held-out lm-eval items) $*"
  python tools/make_corpus.py --output-dir "$run/corpus" --seed 0 "$@"
  step "train a byte-level BPE tokenizer"
  python tools/train_tokenizer.py --input "$run/corpus/train.jsonl" --output "$run/tokenizer" --vocab-size 2048
  step "tokenise into Megatron indexed datasets (EOS appended, no BOS): train split, validation split"
  # The corpus's own splits: every fact the knowledge items ask about is in train.jsonl, none in valid.jsonl.
  python tools/preprocess_data.py --input "$run/corpus/train.jsonl" --tokenizer "$run/tokenizer" \
      --output-prefix "$run/data/corpus" --workers 2 --no-progress
  python tools/preprocess_data.py --input "$run/corpus/valid.jsonl" --tokenizer "$run/tokenizer" \
      --output-prefix "$run/data/corpus_valid" --workers 1 --no-progress
}

# train_model RUN NAME STEPS LAUNCHER CONFIG [--set ...]: trains into RUN/NAME/train
train_model() {
  local run=$1 name=$2 steps=$3 launcher=$4 config=$5
  shift 5
  local -a cmd
  if [ "$launcher" = deepspeed ]; then
    # DeepSpeed's launcher logs its command lines at INFO and, on a machine without a GPU, says so in each
    # of its processes: warnings only, and the CPU named when torch sees no GPU
    if [ -z "${DS_ACCELERATOR:-}" ] && ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
      export DS_ACCELERATOR=cpu
    fi
    cmd=(deepspeed --log_level warning --num_gpus 1 --master_port "$(free_port)" pretrain_loop.py)
  else
    cmd=(python pretrain_loop.py)
  fi
  step "train $name ($config $*) for $steps steps with $launcher"
  "${cmd[@]}" --config "$config" "$@" \
      --set "train.output_dir=$run/$name/train" --set "train.max_steps=$steps" \
      --set "train.save_interval=$steps" --set "train.eval_interval=$(( steps / 3 > 0 ? steps / 3 : 1 ))" \
      --set "data.train_prefixes=[$run/data/corpus]" --set "data.valid_prefixes=[$run/data/corpus_valid]" \
      --set "data.tokenizer=$run/tokenizer" --set "logging.progress_bar=false"
}

# export_and_eval RUN NAME LOOPS LIMIT [extra eval_loops args]: HF export + loop sweep into RUN/NAME/{hf,eval}
export_and_eval() {
  local run=$1 name=$2 loops=$3 limit=$4
  shift 4
  step "export $name to Hugging Face"
  python tools/convert_to_hf.py --checkpoint "$run/$name/train/checkpoints" --output "$run/$name/hf"
  step "loop sweep of $name at r = $loops: bundled knowledge and reasoning tasks (by depth) + held-out loss"
  python tools/eval_loops.py --model "$run/$name/hf" --loops "$loops" --include-path "$run/corpus/eval" \
      --tasks "$LOCAL_TASKS" --limit "$limit" --valid-prefix "$run/data/corpus_valid" --seq-length 128 \
      --output "$run/$name/eval" --no-progress "$@"  # labelled with the run's name, as training recorded it
}
