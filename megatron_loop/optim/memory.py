"""What the training step will still allocate when ``auto`` activation recomputation schedules.

A schedule is made at the first forward (``model/recompute.py``), before the first optimizer step
creates Muon's momentum and AdamW's two moments (on ZeRO >= 1 in fp32 on this rank's partitions:
about 3.6 GB for Llama 4x5 on one rank) and before DeepSpeed's ZeRO 1/2 gradient buckets exist
(allocated in each backward). Both are counted here from the objects themselves: the optimizer's
param groups (after ``deepspeed.initialize`` they hold this rank's flat fp32 partitions, so ZeRO's
partitioning and padding are included) and DeepSpeed's resolved ZeRO config.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_loop.model.recompute import PendingMemory
from megatron_loop.optim.optimizer import MuonAdamW


def unallocated_optimizer_state(optimizer: MuonAdamW) -> int:
    """Bytes of optimizer state not created yet (0 once a step ran or a checkpoint was loaded)."""
    total = 0
    for group in optimizer.param_groups:
        tensors = MuonAdamW.state_tensors(group)
        for param in group["params"]:
            if not optimizer.state.get(param):
                total += tensors * param.numel() * param.element_size()
    return total


def zero_bucket_bytes(engine: Any) -> int:
    """DeepSpeed's gradient buckets allocated during backward, from the engine's ZeRO config.

    ZeRO 1/2 with ``contiguous_gradients``: one ``reduce_bucket_size`` buffer per gradient dtype
    (two with ``overlap_comm``), in the gradient-reduction dtype. ZeRO-3 allocates its reduce bucket
    at initialisation (already allocated when the schedule is made) and gathers up to
    ``stage3_prefetch_bucket_size`` parameter elements ahead of the forward.
    """
    stage = engine.zero_optimization_stage()
    zero = engine.optimizer
    if stage in (1, 2) and engine.zero_contiguous_gradients() and getattr(zero, "ipg_buckets", None) is not None:
        reduction = getattr(zero, "_gradient_reduction_buffer_dtype", lambda: torch.float32)()
        buffers = (2 if engine.zero_overlap_comm() else 1) * max(1, len(zero.ipg_buckets))
        return int(engine.zero_reduce_bucket_size()) * buffers * reduction.itemsize
    if stage == 3:
        itemsize = next(engine.module.parameters()).element_size()
        return int(engine.zero_prefetch_bucket_size()) * itemsize
    return 0


def pending_training_memory(engine: Any, optimizer: MuonAdamW) -> PendingMemory:
    """What the step will hold beyond what is allocated now (read when a schedule is made)."""
    return PendingMemory(optimizer_state=unallocated_optimizer_state(optimizer), buckets=zero_bucket_bytes(engine))
