"""Partial gradients of replicated parameters, summed over the TP group inside backward (for ZeRO).

Under sequence parallelism (and for per-head QK norms) a replicated parameter sees only this TP
rank's part of the activations, so its gradient is a partial sum over the TP group; megatron-core
marks such parameters ``sequence_parallel``. Megatron-LM sums them after backward
(``finalize_model_grads``), but under DeepSpeed that is too late: ZeRO 1/2/3 (and the bf16
optimizer's immediate update) take each gradient into their DP reduction and partitions from
their own hooks on the parameter's gradient accumulation, during backward. A tensor hook on the
parameter runs before any of those (autograd calls it on the incoming gradient, before
accumulation), so the gradient DeepSpeed reduces, accumulates and clips is already the TP sum.

Autograd sums every use of a leaf before its hooks run, so a weight-tied core applied K times
still costs one all-reduce per marked parameter per micro-batch (not K). Every TP rank runs the
same graph, so the hooks fire in the same order on each and the collectives match.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_loop.parallel.mpu import tensor_parallel_size


def sum_partial_grads_in_backward(model: torch.nn.Module) -> int:
    """Hook every ``sequence_parallel`` parameter of ``model`` (TP > 1); returns how many."""
    if tensor_parallel_size() == 1:
        return 0
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()

    def tp_sum(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    params = [p for p in model.parameters() if p.requires_grad and getattr(p, "sequence_parallel", False)]
    for param in params:
        param.register_hook(tp_sum)
    return len(params)
