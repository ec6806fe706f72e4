"""The models and optimizers the modes time, and the steps built from them.

Each family's paper backbone on CUDA; on CPU its twin with the same block structure at widths a
2-core CPU steps in well under a second.
"""

from __future__ import annotations

from typing import Callable

import torch

from megatron_loop.config import ModelConfig, build_model_config
from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config
from megatron_loop.model import build_model
from megatron_loop.parallel.mpu import data_parallel_size
from megatron_loop.parallel.parallelize import parallelize
from megatron_loop.optim import OptimizerSettings, build_engine, build_optimizer

from .harness import Setup

CPU_WIDTHS = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, vocab_size=2048)
FAMILIES = {
    # family: (backbone on cuda, backbone on cpu, (core, loops) loop, (layers, 1) nonloop)
    "llama": ("llama3.1-1b", "tiny-llama", (4, 5), (20, 1)),
    "qwen": ("qwen3-0.6b", "tiny-qwen", (4, 7), (28, 1)),
}


def loop_shape(family: str) -> tuple[int, int]:
    """(core layers, loops) of the family's paper LoopLM (Llama 4x5, Qwen 4x7)."""
    return FAMILIES[family][2]


def model_config(setup: Setup, family: str, core: int, loops: int, **overrides) -> ModelConfig:
    """``family``'s backbone (CPU: at ``CPU_WIDTHS``) with ``core`` x ``loops``, checkpointing off."""
    gpu_backbone, cpu_backbone, _, _ = FAMILIES[family]
    values = dict(backbone=gpu_backbone if setup.cuda else cpu_backbone, core_layers=core, train_loops=loops,
                  recompute="none", compile=setup.compile)
    if not setup.cuda:
        values.update(CPU_WIDTHS)
    values.update(overrides)
    return build_model_config(values)


def cpu_overrides(setup: Setup) -> list[str]:
    """``--set`` overrides that shrink a shipped config's model to ``CPU_WIDTHS`` on CPU (none on CUDA)."""
    if setup.cuda:
        return []
    return [f"model.{k}={v}" for k, v in CPU_WIDTHS.items()] + ["model.rope_scaling=null"]


def build(cfg: ModelConfig, setup: Setup, placement=None, zero_stage: int = 0) -> torch.nn.Module:
    """The model of ``cfg`` (this rank's shards at ``placement``, which ``init_model_parallel`` returned) on the
    setup's device and dtype,
    seeded so every case starts equal, prepared as training prepares it for ``zero_stage``
    (``parallelize``: activation recomputation, compilation, the TP gradient sum)."""
    torch.manual_seed(0)
    model = build_model(cfg, placement).to(device=setup.device, dtype=setup.dtype).train()
    parallelize(model, zero_stage=zero_stage)
    return model


def muon_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The paper's optimizer (App. C.2). Clipping stays with DeepSpeed in training (ZeRO >= 1),
    so it is off here; the optimizer's own clip would read the norm back to the host."""
    return build_optimizer(model, OptimizerSettings(lr=1e-4), clip_in_optimizer=False)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Plain AdamW over every parameter, the fused kernel on CUDA (the fastest AdamW torch has)."""
    extra = {"fused": True} if next(model.parameters()).is_cuda else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **extra)


def forward_backward(model: torch.nn.Module, tokens: torch.Tensor, scale: float = 1.0) -> None:
    loss = model(tokens, labels=tokens, compute_logits=False).loss
    if scale != 1.0:  # gradient accumulation: the engine divides by the micro-batch count
        loss = loss * scale
    loss.backward()


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, tokens: torch.Tensor,
               accumulation: int = 1) -> Callable[[], None]:
    """A full step: ``accumulation`` forward/backward passes, then the optimizer step (none: the
    gradients are dropped, a forward + backward step)."""

    def step() -> None:
        for _ in range(accumulation):
            forward_backward(model, tokens, 1.0 / accumulation)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    return step


def deepspeed_step(cfg: ModelConfig, setup: Setup, tokens: torch.Tensor) -> Callable[[], None]:
    """A full step through the training path: a fresh model in ``build_engine``'s DeepSpeed engine
    (ZeRO-1, bf16 with fp32 master weights on CUDA, fp32 on CPU), MuonAdamW, clipping in ZeRO."""
    settings = OptimizerSettings(lr=1e-4)
    ds = DeepSpeedSettings.resolve(read_ds_config(zero_stage=1), micro_batch_size=tokens.shape[0], grad_accum=1,
                                   data_parallel_size=data_parallel_size(), bf16=setup.cuda,
                                   grad_clip=settings.grad_clip)
    engine = build_engine(build(cfg, setup, zero_stage=1), settings, ds, total_steps=10**6).engine

    def step() -> None:
        loss = engine(tokens, labels=tokens, compute_logits=False).loss
        engine.backward(loss)
        engine.step()

    return step


def full_step(model: torch.nn.Module, cfg: ModelConfig, setup: Setup, tokens: torch.Tensor) -> Callable[[], None]:
    """Forward + backward + Muon+AdamW, on ``model`` (plain) or through a DeepSpeed engine."""
    if setup.engine == "deepspeed":
        return deepspeed_step(cfg, setup, tokens)
    return train_step(model, muon_adamw(model), tokens)
