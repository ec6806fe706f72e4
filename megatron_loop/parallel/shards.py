"""A TP = 1 tensor to this rank's TP shard and back, from megatron-core's partition attributes.

megatron-core marks each TP-sharded parameter with ``partition_dim`` and ``partition_stride``:
the whole tensor is cut along ``partition_dim`` into ``N * stride`` equal blocks and rank t holds
blocks ``t, t + N, ...`` concatenated (stride 2 for the fused SwiGLU ``fc1``, whose rows are
``[gate; up]``: rank t holds ``[gate_t; up_t]``; stride 1 everywhere else: QKV query groups,
output-projection and ``fc2`` columns, vocabulary rows). Replicated tensors are identical on
every rank. (Gathering a live model's shards over the TP group is the TP tests' own
``tp_fixtures.gather_whole``; checkpoints join saved shards with :func:`whole_of`.)
"""

from __future__ import annotations

import torch

from megatron_loop.parallel.grads import is_tensor_parallel


def shard_of(full: torch.Tensor, param: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the whole tensor ``full`` laid out as ``param``."""
    if not is_tensor_parallel(param) or size == 1:
        return full
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    blocks = torch.chunk(full, size * stride, dim=dim)
    return torch.cat(blocks[rank::size], dim=dim)


def whole_of(shards: list[torch.Tensor], param: torch.Tensor) -> torch.Tensor:
    """The whole tensor from every rank's shard (inverse of :func:`shard_of`)."""
    if not is_tensor_parallel(param) or len(shards) == 1:
        return shards[0]
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    pieces = [torch.chunk(s, stride, dim=dim) for s in shards]
    return torch.cat([pieces[r][k] for k in range(stride) for r in range(len(shards))], dim=dim)

