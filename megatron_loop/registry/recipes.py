"""The two backbone families, their training recipes, and how every generated run executes.

A :class:`Family` is one of the paper's backbones with its recipe (App. C.1, C.2, Tables 1 and 3).
:data:`EXECUTION` holds what only decides how a run executes (micro-batch, activation
recomputation, compilation, DeepSpeed config), apart from what it computes: the one place to
change those settings in every generated file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """A backbone family with its recipe (App. C.1, C.2, Tables 1 and 3)."""

    key: str  # file-name prefix
    label: str  # the paper's name
    backbone: str  # config.BACKBONES preset
    toy_backbone: str  # the CPU-sized twin preset
    effective_depth: int  # L(K) of every BaseLoop / CoreLoop / NonLoop run of the family (App. C.1)
    lr: float
    global_batch_size: int
    train_tokens: int
    tokens_note: str
    tokenizer: str
    data_prefix: str  # tools/preprocess_data.py --output-prefix (README step 1)


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "Llama3.1-1B", "llama3.1-1b", "tiny-llama", 20, 1.33847e-3, 1824, 20_149_647_360,
                    "20 tokens/parameter of the 20-layer NonLoop reference (1,007,482,368): 5,394 updates, "
                    "W/S/D 270/4,585/539", "meta-llama/Llama-3.1-8B", "data/fineweb_edu_llama"),
    "qwen": Family("qwen", "Qwen3-0.6B", "qwen3-0.6b", "tiny-qwen", 28, 1.80111e-3, 2048, 11_995_709_440,
                   "12.00B tokens = 2,860 updates x 2,048 x 2,048: W/S/D 143/2,431/286", "Qwen/Qwen3-0.6B",
                   "data/fineweb_edu_qwen"),
}
DATA_PARALLEL = 8  # ranks per run in the paper (App. C.2: 38 x 6 x 8 = 1,824; 32 x 8 x 8 = 2,048)

# Execution settings of every generated file: how a run executes, not what it computes. The ONE
# place to change them (per family, and ``toy`` for the CPU twins of tools/small_study.sh).
EXECUTION: dict[str, dict[str, Any]] = {
    # auto recomputation (budget null: 90 % of the GPU less what the first step finds allocated)
    # and auto compilation (on with CUDA), as measured in docs/BENCHMARKS.md.
    "llama": dict(micro_batch_size=38, recompute="auto", compile="auto",
                  deepspeed_config="deepspeed_configs/zero1.json"),
    "qwen": dict(micro_batch_size=32, recompute="auto", compile="auto",
                 deepspeed_config="deepspeed_configs/zero1.json"),
    "toy": dict(micro_batch_size=8, recompute="none", compile="auto",
                deepspeed_config="deepspeed_configs/zero1.json"),
}
# The toy recipe of the CPU twins (examples/tiny_*.yaml): App. C.2's schedule shape at toy size.
# log_interval: a console line and a metrics.jsonl record every 10 steps (every step would flood the log).
TOY_TRAIN: dict[str, Any] = dict(seq_length=128, global_batch_size=16, lr=3.0e-3, max_steps=300, seed=42,
                                 precision="fp32", save_interval=100, eval_interval=100, eval_batches=4,
                                 log_interval=10)
