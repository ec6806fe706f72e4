"""``--mode train``: the real training path (``build_engine``, DeepSpeed) on a shipped example config,
its micro-batch and checkpointing; reports what ``metrics.jsonl`` reports."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from megatron_loop.gpu.tables import train_summary

from megatron_loop.config import load_config
from megatron_loop.training.loop import train

from .harness import Row, Setup
from .models import cpu_overrides
from .synthetic import random_token_dataset


def bench_train(setup: Setup, config: str, data_prefix: str | None, micro_batch: int | None, accumulation: int,
                overrides: list[str]) -> list[Row]:
    """``pretrain_loop.py --config CONFIG`` for ``--warmup + --steps`` steps: the DeepSpeed engine
    of ``build_engine``, the config's checkpointing, compile and micro-batch (unless overridden),
    one rank, global batch = micro-batch x ``--accumulation``. CPU shrinks the widths and the
    sequence as the other modes do. Reports the medians of what metrics.jsonl logs."""
    with tempfile.TemporaryDirectory() as tmp:
        base = load_config(config)
        micro = micro_batch or base.train.micro_batch_size
        sets = [f"train.seq_length={setup.seq}", f"train.micro_batch_size={micro}",
                f"train.global_batch_size={micro * accumulation}", f"train.max_steps={setup.steps + setup.warmup}",
                "train.train_tokens=null", f"train.output_dir={tmp}/run", "train.save_interval=1000000",
                "train.eval_interval=0", "train.resume=false", "logging.wandb_project=null",
                "logging.progress_bar=false", "data.valid_prefixes=[]", "data.tokenizer=null",
                *cpu_overrides(setup)]
        cfg = load_config(config, overrides=sets + list(overrides))
        prefix = data_prefix or random_token_dataset(Path(tmp), cfg.model.vocab_size,
                                                      (setup.steps + setup.warmup + 2) * micro * accumulation
                                                      * (setup.seq + 1))
        cfg = load_config(config, overrides=sets + list(overrides) + [f"data.train_prefixes=[{prefix}]"])
        code = train(cfg)
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    metrics = train_summary(records, setup.warmup)
    measured = metrics.pop("steps_measured")
    metrics["exit_code"] = code
    params = {"config": config, "micro_batch": micro, "accumulation": accumulation,
              "recompute": cfg.model.recompute, "compile": cfg.model.compile_enabled,
              "loss_implementation": cfg.model.loss_implementation, "steps_measured": measured}
    return [Row("train", f"{Path(config).stem} ({measured} steps, median)", params, metrics)]


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_train(setup, args.config, args.data_prefix, args.micro_batch, args.accumulation or 1, args.set)
