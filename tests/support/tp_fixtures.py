"""Shared pieces of the tensor-parallel tests: the tiny LoopLMs they compare (with conditioning),
their inputs, and the TP = 1 reference (plain functions, as data_fixtures.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from megatron_loop.config import build_model_config
from megatron_loop.model.placement import tensor_parallel_group
from megatron_loop.parallel.grads import is_tensor_parallel
from megatron_loop.parallel.shards import whole_of

SEED = 1234
SEQ = 12  # divisible by 2 and 4 (sequence parallelism splits it over the TP group)
MICRO = 2
CHUNK = 7  # tokens per loss chunk: several chunks, one of them ragged

# name -> model section. ``llama``: untied head, initial + history injection, Loop Gating;
# ``qwen``: QK norms (gradients partial over heads), tied embedding, dense injection, AdaLN,
# per-loop activation recomputation (the TP collectives rerun in the recomputation), Huginn's sandwich-normed
# blocks and final norm on the recurrent output (model.block_norm, model.norm_core_output);
# ``branch``: Branch Gating with scalar history, selective activation recomputation;
# ``shortcut``: LoopFormer's shortcut modulation trained with its objective (``forward_kwargs``: a full and a
# short trajectory, their consistency MSE on the head input), per-loop activation recomputation.
MODELS = {
    "llama": dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3,
                  vocab_size=256, initial_injection="channel", injection_init_noise=0.03,
                  history_injection="channel", history_window=2, timestep="loop_gating",
                  recompute="none", compile=False),
    "qwen": dict(backbone="tiny-qwen", prelude_layers=1, core_layers=1, coda_layers=1, train_loops=2,
                 vocab_size=256, initial_injection="dense", timestep="adaln", recompute="per_loop",
                 block_norm="sandwich", norm_core_output=True, compile=False),
    "branch": dict(backbone="tiny-llama", core_layers=2, train_loops=3, vocab_size=256,
                   history_injection="scalar", history_window=1, timestep="branch_gating",
                   recompute="selective", compile=False),
    "shortcut": dict(backbone="tiny-llama", core_layers=2, train_loops=3, vocab_size=256, timestep="shortcut",
                     recompute="per_loop", compile=False),
}


def forward_kwargs(model) -> dict:
    """The training step's extra forward arguments: LoopFormer's objective on a fixed short trajectory."""
    if model.config.timestep != "shortcut":
        return {}
    from megatron_loop.model.shortcut import ShortcutTrajectory

    return {"objective": ShortcutTrajectory((1, 2))}


def model_config(name: str):
    return build_model_config(MODELS[name])


def batch(dp_rank: int, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel rank ``dp_rank``'s micro-batch: tokens and labels with a few ignored positions."""
    g = torch.Generator().manual_seed(100 + dp_rank)
    tokens = torch.randint(0, vocab, (MICRO, SEQ), generator=g)
    labels = tokens.clone()
    labels[0, 3] = labels[1, 8] = -100
    return tokens, labels


def perturb(model: torch.nn.Module) -> None:
    """Move every conditioning parameter off its identity initialisation (seeded), so that each one
    shapes the loss and has a gradient worth comparing."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("injection", "gating", "gate", "adaln")):
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def run(model, dp_ranks: list[int]) -> dict:
    """Loss, logits and gradients of the mean loss over the given data-parallel ranks' batches."""
    model.loss_chunk_tokens = CHUNK
    model.zero_grad(set_to_none=True)
    losses, logits = [], []
    for r in dp_ranks:
        tokens, labels = batch(r)
        out = model(tokens, labels=labels, **forward_kwargs(model))
        (out.loss / len(dp_ranks)).backward()
        losses.append(out.loss.detach())
        logits.append(out.logits.detach())
    return {"losses": torch.stack(losses), "logits": torch.stack(logits),
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


TRAIN_STEPS = 20
TRAIN_LR = 3e-3


def train(model, dp_ranks: list[int], after_backward=lambda: None) -> list[float]:
    """TRAIN_STEPS AdamW steps (elementwise, so a shard's update is the whole update's shard) on the
    mean loss over ``dp_ranks``' batches (a different batch each step); the loss before each step.
    ``after_backward`` reduces the gradients (TP sum, DP mean) before the step."""
    model.loss_chunk_tokens = CHUNK
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.1)
    losses = []
    for step in range(TRAIN_STEPS):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for r in dp_ranks:
            tokens, labels = batch(r + 1000 * (step % 2))  # two batches to learn
            loss = model(tokens, labels=labels).loss / len(dp_ranks)
            loss.backward()
            total += loss.item()
        after_backward()
        optimizer.step()
        losses.append(total)
    return losses


def reference(name: str, dp_size: int) -> dict:
    """The TP = 1 model (same seed) on the same batches: initial weights, losses, logits, gradients."""
    from megatron_loop.model import build_model

    torch.manual_seed(SEED)
    model = build_model(model_config(name))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    perturb(model)
    return {"init": init, **run(model, list(range(dp_size)))}


def reference_training(name: str, dp_size: int) -> list[float]:
    from megatron_loop.model import build_model

    torch.manual_seed(SEED)
    return train(build_model(model_config(name)), list(range(dp_size)))


def data_config(prefix: str):
    """A tiny run config on the test corpus (``data_fixtures.data_assets``) for the data-sharding check."""
    from megatron_loop.config import config_from_dict

    return config_from_dict({
        "model": {"backbone": "tiny-llama", "vocab_size": 640},
        "train": {"seq_length": 16, "global_batch_size": 8, "micro_batch_size": 2, "max_steps": 2,
                  "eval_interval": 0},
        "data": {"train_prefixes": [prefix], "num_workers": 0},
        "parallel": {"tensor_model_parallel_size": 2}})


def first_micro_batches(loader, n: int = 3) -> list[list[list[int]]]:
    batches = []
    for batch in loader:
        batches.append(batch["tokens"].tolist())
        if len(batches) == n:
            break
    return batches


def gather_whole(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (per parameter name: the parameter's value, gradient, ... on this rank) gathered
    over the TP group into whole tensors (collective: every TP rank calls it)."""
    group = tensor_parallel_group()
    size = dist.get_world_size(group)
    out = {}
    for name, p in model.named_parameters():
        t = tensors[name].contiguous()
        if not is_tensor_parallel(p) or size == 1:
            out[name] = t
            continue
        shards = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(shards, t, group=group)
        out[name] = whole_of(shards, p)
    return out
