"""Global-batch sampler: data-parallel sharding and exact resume.

Global batch ``g`` is always samples ``[g * G, (g + 1) * G)`` of the (already seed-shuffled,
see ``packed.py``) dataset, whatever the number of ranks; data-parallel rank ``r`` of ``D``
reads the contiguous slice ``[r * G / D, (r + 1) * G / D)`` of it, as ``G / (D * m)``
micro-batches of ``m`` (micro-batch x accumulation steps x data-parallel size = global batch).
Resuming from ``consumed_samples`` (a multiple of ``G``) starts at the next global batch, so an
interrupted run sees exactly the batches an uninterrupted one would (SPEC "Data semantics").
An incomplete final global batch is never produced.
"""

from __future__ import annotations

from typing import Iterator

from megatron_loop.errors import LoopConfigError


class GlobalBatchSampler:
    """Yields this rank's micro-batches (lists of sample indices), in training order."""

    def __init__(self, total_samples: int, global_batch_size: int, micro_batch_size: int,
                 dp_rank: int = 0, dp_size: int = 1, consumed_samples: int = 0) -> None:
        if min(global_batch_size, micro_batch_size, dp_size) < 1:
            raise LoopConfigError("global_batch_size, micro_batch_size and data-parallel size must be >= 1")
        if global_batch_size % (micro_batch_size * dp_size):
            raise LoopConfigError(
                f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
                f"{micro_batch_size} x data-parallel size {dp_size}; expected "
                "micro-batch x accumulation steps x data-parallel size = global batch")
        if not 0 <= dp_rank < dp_size:
            raise LoopConfigError(f"data-parallel rank {dp_rank}: expected 0 <= rank < {dp_size}")
        self.total_samples = total_samples
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.accumulation_steps = global_batch_size // (micro_batch_size * dp_size)
        self.num_global_batches = total_samples // global_batch_size
        self.consumed_samples = consumed_samples

    @property
    def consumed_samples(self) -> int:
        """Samples of the whole run already trained on; set it before iterating to resume."""
        return self._consumed_samples

    @consumed_samples.setter
    def consumed_samples(self, value: int) -> None:
        if value < 0 or value % self.global_batch_size:
            raise LoopConfigError(f"consumed_samples {value}: expected a non-negative multiple of "
                                  f"global_batch_size {self.global_batch_size}")
        self._consumed_samples = int(value)

    def __len__(self) -> int:
        """Micro-batches this rank still has to read."""
        remaining = max(0, self.num_global_batches - self.consumed_samples // self.global_batch_size)
        return remaining * self.accumulation_steps

    def __iter__(self) -> Iterator[list[int]]:
        per_rank = self.global_batch_size // self.dp_size
        mb = self.micro_batch_size
        for g in range(self.consumed_samples // self.global_batch_size, self.num_global_batches):
            base = g * self.global_batch_size + self.dp_rank * per_rank
            for m in range(self.accumulation_steps):
                yield list(range(base + m * mb, base + (m + 1) * mb))
