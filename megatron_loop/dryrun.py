"""``pretrain_loop.py --dry-run``: what a config would train, computed on the meta device.

The default token budget is the paper's Chinchilla rule (Sec. 2.2, App. A.1): 20 tokens per
parameter of the NonLoop model with L(K) layers (same backbone, no conditioning).
steps = tokens // (global_batch * seq_length); WSD split 5% / 85% / rest (App. A.2).
"""

from __future__ import annotations

import dataclasses

from megatron_loop.config import Config, ModelConfig
from megatron_loop.optim.schedule import wsd_split


def nonloop_reference(model: ModelConfig) -> ModelConfig:
    """The NonLoop ``L(K)x1`` model of the same backbone, without conditioning."""
    return dataclasses.replace(model, prelude_layers=0, coda_layers=0, core_layers=model.effective_depth(),
                               train_loops=1, initial_injection="none", history_injection="none", timestep="none")


def count_parameters(model_cfg: ModelConfig) -> tuple[int, int]:
    """(all trainable parameters, backbone parameters without conditioning), built on the meta device."""
    from megatron_loop.model import build_model

    model = build_model(model_cfg, device="meta")
    return model.num_parameters(), model.num_parameters(backbone_only=True)


def training_plan(cfg: Config) -> dict:
    """Token budget, steps and WSD split of a run (the numbers the trainer uses)."""
    t = cfg.train
    tokens_per_step = t.global_batch_size * t.seq_length
    if t.max_steps is not None:
        steps = t.max_steps
        tokens = steps * tokens_per_step
    else:
        if t.train_tokens is not None:
            tokens = t.train_tokens
        else:
            tokens = int(t.tokens_per_parameter * count_parameters(nonloop_reference(cfg.model))[1])
        steps = tokens // tokens_per_step
    warmup, stable, decay = wsd_split(steps, t.warmup_fraction, t.stable_fraction) if steps else (0, 0, 0)
    return dict(train_tokens=tokens, train_steps=steps, warmup_steps=warmup, stable_steps=stable, decay_steps=decay)


def dry_run_report(cfg: Config) -> dict:
    params, backbone = count_parameters(cfg.model)
    return dict(
        layout=cfg.model.layout,
        params=params,
        params_backbone=backbone,
        physical_depth=cfg.model.physical_depth,
        effective_depth=cfg.model.effective_depth(),
        **training_plan(cfg),
        global_batch=cfg.train.global_batch_size,
        micro_batch=cfg.train.micro_batch_size,
        seq_length=cfg.train.seq_length,
    )
