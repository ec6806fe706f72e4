"""The gradients of replicated parameters under tensor parallelism: which are partial over the TP
group, and the one place they are summed (megatron-core's ``finalize_model_grads``, its
tensor-parallel part, moved inside backward for DeepSpeed).

A parameter that every TP rank holds whole gets a complete gradient on each rank only if it saw the
whole activation. Two kinds do not, and their gradients are partial sums over the TP group:

* with ``sequence_parallel`` every replicated parameter (block and final RMSNorms, all
  conditioning: initial/history injection, Loop Gating, Branch Gating, AdaLN) sees only this
  rank's sequence shard;
* the per-head QK RMSNorm weights (Qwen3) see only this rank's heads, with or without
  sequence parallelism.

TP-sharded parameters (megatron-core sets ``tensor_model_parallel`` on them: QKV, output
projection, MLP, embedding and LM head rows) have complete gradients for their shard. Without
sequence parallelism the other replicated parameters see the whole (all-reduced) activation, so
their gradients are already complete and equal on every TP rank.

Where the sum happens (:func:`register_tp_gradient_sum`, called by
:func:`megatron_loop.parallel.parallelize.parallelize`): Megatron-LM sums these gradients after
backward, on its gradient buffers. Under DeepSpeed that is too late: ZeRO 1/2/3 (and the bf16
optimizer's immediate update) take each gradient into their data-parallel reduction and partitions
from their own hooks on the parameter's gradient accumulation, during backward, so a post-backward
sum would have to reach into each stage's private buffers. A tensor hook on the parameter runs
before any of those (autograd calls it on the incoming gradient, before accumulation): the gradient
DeepSpeed reduces, accumulates and clips is already the TP sum. The hook must return the complete
gradient, so the sums cannot be deferred and bucketed: there is one all-reduce per partial parameter
per micro-batch. Autograd sums every use of a leaf before its hooks run, so a weight-tied core
applied K times costs one all-reduce per parameter, not K; ``tools/bench.py --mode tp`` reports
their count and time. Every TP rank runs the same graph, so the hooks fire in the same order on each
and the collectives match.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from megatron_loop.model.placement import tensor_parallel_group

QK_NORMS = (".q_layernorm.", ".k_layernorm.")


def is_tensor_parallel(param: torch.Tensor) -> bool:
    """True for a TP shard (megatron-core's attribute)."""
    return bool(getattr(param, "tensor_model_parallel", False))


def partial_grad_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every parameter whose gradient is partial over the TP group (see the
    module docstring); empty at TP = 1."""
    placement = model.tensor_parallel.placement
    if placement.tp_size == 1:
        return []
    return [(name, p) for name, p in model.named_parameters()
            if p.requires_grad and not is_tensor_parallel(p)
            and (placement.sequence_parallel or any(q in f".{name}" for q in QK_NORMS))]


def register_tp_gradient_sum(model: nn.Module) -> int:
    """Sum each partial gradient over the TP group inside backward, before DeepSpeed (or any optimizer)
    sees it; returns how many parameters are hooked (0 at TP = 1). Registered once per model (its declared
    ``tp_gradient_sum`` says whether it is)."""
    params = partial_grad_parameters(model)
    if not params or model.tp_gradient_sum:
        return len(params)
    group = tensor_parallel_group()

    def tp_sum(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    for _, param in params:
        param.register_hook(tp_sum)
    model.tp_gradient_sum = True
    return len(params)
