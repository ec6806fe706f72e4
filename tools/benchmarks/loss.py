"""``--mode loss``: the LM head + cross-entropy alone, the chunked torch reference against Liger's
fused kernel (CUDA): speed, host syncs, and the two compared in value (loss and both gradients; the
check against an fp32 reference is ``megatron_loop/measure/loss_check.py``)."""

from __future__ import annotations

import argparse

import torch

from megatron_loop.measure.loss_check import compare
from megatron_loop.model.loss import DEFAULT_CHUNK_TOKENS, chunked_linear_cross_entropy

from .harness import Case, ModelFlops, Row, Setup, measure, speed_ratios
from .models import loop_shape, model_config


def bench_loss(setup: Setup, families: list[str]) -> list[Row]:
    """The LM head + cross-entropy alone (forward + backward) at the micro-batch's tokens: the
    chunked torch reference vs Liger's fused kernel (CUDA only), interleaved."""
    rows = []
    for family in families:
        core, loops = loop_shape(family)
        # No Prelude or Coda: at zero loops the model's training FLOPs are its LM head's alone,
        # 3 x 2dV per token (forward and the two backward matmuls), what this mode runs.
        cfg = model_config(setup, family, core, loops, prelude_layers=0, coda_layers=0)
        head_only = ModelFlops(cfg, setup.seq, num_loops=0)
        n = setup.micro_batch * setup.seq
        g = torch.Generator(device="cpu").manual_seed(0)
        hidden = torch.randn(n, cfg.hidden_size, generator=g).to(setup.device, setup.dtype).requires_grad_(True)
        weight = (0.02 * torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)).to(setup.device, setup.dtype)
        weight.requires_grad_(True)
        targets = torch.randint(0, cfg.vocab_size, (n,), generator=g).to(setup.device)

        def step(impl):
            def run():
                chunked_linear_cross_entropy(hidden, weight, targets, DEFAULT_CHUNK_TOKENS,
                                             implementation=impl).backward()
                hidden.grad = weight.grad = None
            return run

        impls = ("chunked", "fused") if setup.cuda else ("chunked",)  # Triton needs CUDA
        measured = measure({impl: Case(step(impl), n, head_only, check_syncs=True) for impl in impls}, setup)
        for impl, m in measured.items():
            rows.append(Row("loss", f"{family} head+CE {impl}", {"tokens": n, "vocab": cfg.vocab_size}, m))
        if len(impls) == 2:
            values = {}
            for impl in impls:  # one more step each, its results kept: fused vs chunked in value
                loss = chunked_linear_cross_entropy(hidden, weight, targets, DEFAULT_CHUNK_TOKENS, implementation=impl)
                loss.backward()
                values[impl] = (loss.detach(), hidden.grad, weight.grad)
                hidden.grad = weight.grad = None
            differences = compare(values["fused"], values["chunked"])
            rows.append(Row("loss", f"ratio {family} fused / chunked", {},
                            {**speed_ratios(measured["fused"], measured["chunked"]),
                             **{f"{k}_fused_vs_chunked": v for k, v in differences.items()}}))
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_loss(setup, args.families)
