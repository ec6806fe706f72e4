"""``--mode eval``: forward throughput of the HF export at several loop counts r, against the
training model it was exported from."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from megatron_loop.export.convert import export_state_dict

from .harness import Case, Row, Setup, measure, release, speed_ratios
from .models import build, loop_shape, model_config
from .synthetic import random_tokens


def bench_eval(setup: Setup, family: str, loops_list: list[int], eval_batch: int) -> list[Row]:
    """Forward tokens/s of the HF export (``trust_remote_code``) against the training model."""
    core, loops = loop_shape(family)
    cfg = model_config(setup, family, core, loops, compile=False)
    model = build(cfg, setup).eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        state = {k: v.float().cpu() for k, v in model.state_dict().items() if torch.is_tensor(v)}
        export_state_dict(state, cfg, Path(tmp) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", trust_remote_code=True,
                                                  dtype=setup.dtype).to(setup.device).eval()
    tokens = random_tokens(cfg, setup, eval_batch)
    for r in loops_list:
        with torch.no_grad():
            m = measure({"hf": Case(lambda: hf(tokens, num_loops=r, use_cache=False), tokens.numel(), memory=False),
                         "train": Case(lambda: model(tokens, num_loops=r), tokens.numel(), memory=False)}, setup)
        metrics = {"hf_tokens_per_s": m["hf"]["tokens_per_s"], "train_model_tokens_per_s": m["train"]["tokens_per_s"],
                   **{f"hf_vs_train_{k}": v for k, v in speed_ratios(m["hf"], m["train"]).items()}}
        rows.append(Row("eval", f"{family} {core}x{loops} r={r}", {"r": r, "batch": eval_batch}, metrics))
    del model, hf
    release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_eval(setup, args.families[0], args.eval_loops, eval_batch=setup.micro_batch)
