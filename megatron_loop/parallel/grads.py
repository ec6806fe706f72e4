"""Gradients of replicated parameters under tensor parallelism (megatron-core's
``finalize_model_grads``, the tensor-parallel part).

A parameter that every TP rank holds whole gets a complete gradient on each rank only if it
saw the whole activation. Two kinds do not, and their gradients are partial sums that must be
summed over the TP group once per step, after backward and before the optimizer reads them:

* with ``sequence_parallel`` every replicated parameter (block and final RMSNorms, all
  conditioning: initial/history injection, Loop Gating, Branch Gating, AdaLN) sees only this
  rank's sequence shard;
* the per-head QK RMSNorm weights (Qwen3) see only this rank's heads, with or without
  sequence parallelism.

TP-sharded parameters (megatron-core sets ``tensor_model_parallel`` on them: QKV, output
projection, MLP, embedding and LM head rows) have complete gradients for their shard. Without
sequence parallelism the other replicated parameters see the whole (all-reduced) activation, so
their gradients are already complete and equal on every TP rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from megatron_loop.parallel.state import tensor_parallel_group

QK_NORMS = (".q_layernorm.", ".k_layernorm.")


def is_tensor_parallel(param: torch.Tensor) -> bool:
    """True for a TP shard (megatron-core's attribute)."""
    return bool(getattr(param, "tensor_model_parallel", False))


def partial_grad_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradients are partial over the TP group (see the module docstring)."""
    layout = getattr(model, "tensor_parallel").layout
    if layout.tp_size == 1:
        return []
    return [p for name, p in model.named_parameters()
            if p.requires_grad and not is_tensor_parallel(p)
            and (layout.sequence_parallel or any(q in f".{name}" for q in QK_NORMS))]


def mark_sequence_parallel(model: nn.Module) -> None:
    """Set megatron-core's ``sequence_parallel`` attribute on the parameters whose gradients are
    partial (what megatron's own ``finalize_model_grads`` looks for)."""
    for p in partial_grad_parameters(model):
        p.sequence_parallel = True


def allreduce_partial_grads(model: nn.Module) -> int:
    """Sum the partial gradients over the TP group in one coalesced all-reduce (call after backward,
    before gradient clipping and the optimizer step). Returns the number of tensors reduced."""
    grads = [p.grad for p in partial_grad_parameters(model) if p.grad is not None]
    if not grads:
        return 0
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=tensor_parallel_group())
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)
    return len(grads)
