"""``--mode peers``: our step against HF transformers' LlamaForCausalLM / Qwen3ForCausalLM at the same
widths, depth (p + Ks + c layers) and micro-batch, eager (and torch.compile'd with ``--compile``)."""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from megatron_loop.config import ModelConfig

from .harness import Case, ModelFlops, Row, Setup, measure, release, speed_ratios
from .models import build, loop_shape, model_config, train_step
from .synthetic import random_tokens


def hf_peer(cfg: ModelConfig, setup: Setup) -> torch.nn.Module:
    """HF transformers' own model at our widths with L(K) = p + Ks + c layers (SDPA attention), as a
    user would train the NonLoop reference: Llama (untied) or Qwen3 (QK-norm, tied)."""
    common = dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                  head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                  rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
                  num_hidden_layers=cfg.effective_depth(), tie_word_embeddings=cfg.tie_word_embeddings,
                  attn_implementation="sdpa", use_cache=False)
    if cfg.qk_norm:
        hf_cfg, cls = Qwen3Config(**common), Qwen3ForCausalLM
    else:
        hf_cfg, cls = LlamaConfig(**common, rope_scaling=cfg.rope_scaling), LlamaForCausalLM
    torch.manual_seed(0)
    return cls(hf_cfg).to(device=setup.device, dtype=setup.dtype).train()


def bench_peers(setup: Setup, families: list[str]) -> list[Row]:
    """Forward + backward of our loop model vs HF's model of the same effective depth, interleaved;
    with ``--compile`` also ``model.compile=true`` vs ``torch.compile(hf_model)``."""
    rows = []
    for family in families:
        core, loops = loop_shape(family)
        cases = {}
        for compiled in (False, True) if setup.compile else (False,):
            tag = "compiled" if compiled else "eager"
            cfg = model_config(setup, family, core, loops, compile=compiled)
            ours = build(cfg, setup)
            tokens = random_tokens(cfg, setup)
            flops = ModelFlops(cfg, setup.seq)  # HF's model at depth L(K) does the same matmuls
            hf = hf_peer(cfg, setup)
            if compiled:
                hf = torch.compile(hf)

            def hf_step(hf=hf, tokens=tokens):
                hf(input_ids=tokens, labels=tokens).loss.backward()
                hf.zero_grad(set_to_none=True)

            cases[f"{family} {core}x{loops} ours {tag}"] = Case(train_step(ours, None, tokens), tokens.numel(), flops,
                                                             check_syncs=not compiled)
            cases[f"{family} {cfg.effective_depth()}L HF {tag}"] = Case(hf_step, tokens.numel(), flops)
        measured = measure(cases, setup)
        names = list(measured)
        for name, metrics in measured.items():
            rows.append(Row("peers", name, {}, metrics))
        for i in range(0, len(names), 2):
            ratios = speed_ratios(measured[names[i]], measured[names[i + 1]])
            rows.append(Row("peers", f"ratio {names[i]} / {names[i + 1]}", {}, {**ratios, "target": ">= 1.10"}))
        if setup.compile:  # the comparison the target names: our compiled step vs HF + torch.compile
            ratios = speed_ratios(measured[names[2]], measured[names[3]])
            rows.append(Row("peers", f"ratio {names[2]} / {names[3]}", {}, {**ratios, "target": ">= 1.10"}))
            rows.pop(-2)  # already listed
        del cases
        release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_peers(setup, args.families)
