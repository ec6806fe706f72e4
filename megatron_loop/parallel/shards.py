"""How megatron-core slices a weight over the TP ranks, and how the slices go back together.

A TP-sharded weight carries megatron-core's attributes ``tensor_model_parallel``,
``partition_dim`` (0: rows, ``ColumnParallelLinear`` and ``VocabParallelEmbedding``; 1: columns,
``RowParallelLinear``) and ``partition_stride``. Stride 1 is a plain contiguous slice; stride
``s`` (the fused SwiGLU fc1, ``s = 2``) means the weight is ``s`` stacked parts (gate, up) and
each part is sliced on its own, rank ``r`` holding ``[part_0 slice r; part_1 slice r; ...]``.
The same three numbers describe the layout for a checkpoint (recorded per weight) and for Muon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardSpec:
    """``dim`` and ``stride`` of a TP-sharded weight (None for a replicated one)."""

    dim: int
    stride: int = 1

    @classmethod
    def of(cls, param: torch.Tensor) -> ShardSpec | None:
        if not getattr(param, "tensor_model_parallel", False):
            return None
        return cls(int(getattr(param, "partition_dim", 0)), int(getattr(param, "partition_stride", 1)))

    def shard(self, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s slice of the whole (TP = 1) tensor ``full``."""
        parts = full.chunk(self.stride, dim=self.dim)
        return torch.cat([part.chunk(tp, dim=self.dim)[rank] for part in parts], dim=self.dim).contiguous()

    def merge(self, shards: Sequence[torch.Tensor]) -> torch.Tensor:
        """The whole tensor from every rank's slice (rank order): the inverse of :meth:`shard`."""
        per_rank = [shard.chunk(self.stride, dim=self.dim) for shard in shards]
        return torch.cat([torch.cat([parts[j] for parts in per_rank], dim=self.dim) for j in range(self.stride)],
                         dim=self.dim)
