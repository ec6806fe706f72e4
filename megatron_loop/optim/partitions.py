"""Where each weight's elements sit inside a ZeRO flat partition, and how to gather them back.

Under ZeRO >= 1 DeepSpeed hands the wrapped optimizer one flat 1-D fp32 partition per param
group (stage 1/2) or per sub-group (stage 3), so a stock Muon never sees a matrix.
Muon's momentum is elementwise and stays on the partition (sharded, checkpointed by ZeRO);
only Newton-Schulz needs whole matrices. A :class:`ZeroPartition` all-gathers the momentum
direction of the partition across the data-parallel group, rebuilds the full matrices that
overlap this rank's partition, and writes their update back into the local partition.

Two DeepSpeed layouts, both read from the ZeRO optimizer's own bookkeeping
(see :mod:`megatron_loop.optim.engine`), never guessed:

* contiguous (ZeRO 1/2): the group's params are concatenated (with DeepSpeed's per-param
  alignment padding) into one flat buffer that is cut into ``world`` equal partitions;
* striped (ZeRO 3): every param is cut into ``world`` equal pieces (the last zero-padded) and
  a sub-group's partition is the concatenation of this rank's piece of each param.

Each rank runs Newton-Schulz only for the weights that overlap its own partition: under ZeRO
1/2 that is about 1/world of them (plus the ones cut by a partition boundary, computed on both
sides, identically); under ZeRO 3 every weight is striped over every rank, so every rank
orthogonalises all of them (redundant compute, no extra communication).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Piece:
    """``length`` elements of a param's flat view, held by ``rank`` at ``local_offset``."""

    rank: int
    local_offset: int
    param_offset: int
    length: int


@dataclass(frozen=True)
class Slot:
    """One model weight inside a partitioned group: its full shape and its pieces per rank."""

    param: torch.nn.Parameter
    shape: torch.Size
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


class ZeroPartition:
    """Maps one flat ZeRO partition back to the full weights it (partly) holds."""

    def __init__(
        self,
        slots: Sequence[Slot],
        partition_numel: int,
        rank: int,
        world: int,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.slots = tuple(slots)
        self.partition_numel = partition_numel
        self.rank = rank
        self.world = world
        self.group = group
        for slot in self.slots:
            covered = sum(piece.length for piece in slot.pieces)
            if covered != slot.numel:
                raise ValueError(f"layout covers {covered} of {slot.numel} elements of a {tuple(slot.shape)} weight")

    @classmethod
    def contiguous(
        cls,
        params: Sequence[torch.nn.Parameter],
        shapes: Sequence[torch.Size],
        offsets: Sequence[int],
        partition_numel: int,
        group: dist.ProcessGroup | None,
    ) -> ZeroPartition:
        """ZeRO 1/2: param ``j`` spans ``[offsets[j], offsets[j] + numel_j)`` of the flat
        buffer and rank ``r`` holds ``[r * partition_numel, (r + 1) * partition_numel)``."""
        rank, world = _rank_world(group)
        slots = []
        for param, shape, offset in zip(params, shapes, offsets, strict=True):
            numel = int(torch.Size(shape).numel())
            pieces = []
            for r in range(world):
                start = max(offset, r * partition_numel)
                end = min(offset + numel, (r + 1) * partition_numel)
                if start < end:
                    pieces.append(Piece(r, start - r * partition_numel, start - offset, end - start))
            slots.append(Slot(param, torch.Size(shape), tuple(pieces)))
        return cls(slots, partition_numel, rank, world, group)

    @classmethod
    def striped(
        cls,
        params: Sequence[torch.nn.Parameter],
        shapes: Sequence[torch.Size],
        piece_numels: Sequence[int],
        group: dist.ProcessGroup | None,
    ) -> ZeroPartition:
        """ZeRO 3: rank ``r`` holds elements ``[r * piece_j, (r + 1) * piece_j)`` of param ``j``
        at local offset ``sum(piece_k for k < j)``."""
        rank, world = _rank_world(group)
        slots = []
        local_offset = 0
        for param, shape, piece in zip(params, shapes, piece_numels, strict=True):
            numel = int(torch.Size(shape).numel())
            pieces = []
            for r in range(world):
                length = max(0, min(piece, numel - r * piece))
                if length:
                    pieces.append(Piece(r, local_offset, r * piece, length))
            slots.append(Slot(param, torch.Size(shape), tuple(pieces)))
            local_offset += piece
        return cls(slots, local_offset, rank, world, group)

    def map_full(
        self, local: torch.Tensor, fn: Callable[[torch.Tensor, torch.nn.Parameter], torch.Tensor]
    ) -> torch.Tensor:
        """``fn`` applied to every full weight that overlaps this rank, as a new local partition.

        Collective over the data-parallel group: every rank must call it in the same order.
        Elements of the partition that belong to no weight (alignment padding) come back zero.
        """
        if local.numel() != self.partition_numel:
            raise ValueError(f"partition has {local.numel()} elements, layout expects {self.partition_numel}")
        gathered = self._all_gather(local.reshape(-1))
        out = torch.zeros_like(local).reshape(-1)
        for slot in self.slots:
            mine = [piece for piece in slot.pieces if piece.rank == self.rank]
            if not mine:
                continue  # another rank owns this weight entirely: it computes the update
            full = torch.empty(slot.numel, dtype=local.dtype, device=local.device)
            for piece in slot.pieces:
                full[piece.param_offset : piece.param_offset + piece.length] = gathered[piece.rank].narrow(
                    0, piece.local_offset, piece.length
                )
            result = fn(full.view(slot.shape), slot.param).reshape(-1)
            for piece in mine:
                out[piece.local_offset : piece.local_offset + piece.length] = result[
                    piece.param_offset : piece.param_offset + piece.length
                ]
        return out.view_as(local)

    def _all_gather(self, flat: torch.Tensor) -> list[torch.Tensor]:
        if self.world == 1:
            return [flat]
        # list-based all_gather: supported by gloo (CPU tests) and nccl alike
        parts = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(parts, flat.contiguous(), group=self.group)
        return parts


def _rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group=group), dist.get_world_size(group=group)
