"""Muon on tensor-parallel shards (App. C.2 "Optimizer" at TP > 1).

Newton-Schulz orthogonalises a whole matrix; under TP every rank holds a slice of it
(megatron-core ``ColumnParallelLinear``: rows, ``partition_dim`` 0; ``RowParallelLinear``:
columns, ``partition_dim`` 1). Each rank therefore all-gathers the Newton-Schulz input of a
sharded weight over its TP group, orthogonalises the whole matrix per projection exactly as at
TP = 1 (:func:`megatron_loop.optim.muon.orthogonalize_projections`), and keeps its own slice of
the update. Every TP rank computes the same full update (Megatron-LM's "duplicated" mode of its
tensor-parallel Muon): one all-gather per matrix, TP-fold redundant Newton-Schulz, no extra
memory beyond one full matrix at a time. Replicated matrices (dense injection matrices under
``train.muon_conditioning_matrices``) are orthogonalised locally, identically on every TP rank.

Fused projections. megatron-core shards a fused weight so that every rank's slice is itself a
fused weight of the same kind: the QKV of ``num_groups / TP`` whole query groups
(``[q, k, v]`` per group), and the SwiGLU fc1 as ``[gate slice; up slice]`` (its
``partition_stride`` is 2). Gathered along dim 0 that gives ``[q0 k0 v0 | q1 k1 v1]`` and
``[g0; u0; g1; u1]``. The rows of projection ``j`` of the whole matrix are those of projection
``j`` of every rank's slice, rank after rank -- for QKV exactly :class:`roles.QKVSplit`'s rows
of the TP = 1 matrix, for fc1 the TP = 1 gate rows ``[g0; g1]`` and up rows ``[u0; u1]`` in
their TP = 1 order -- so each projection's Newton-Schulz input is the TP = 1 one, row for row.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.utils.weak import WeakTensorKeyDictionary

from megatron_loop.model import roles
from megatron_loop.optim.muon import ScaleRule, orthogonalize_projections, orthogonalized_update
from megatron_loop.parallel.grads import is_tensor_parallel
from megatron_loop.parallel.mpu import tensor_parallel_size


def shard_split(split, tp: int, local_rows: int):
    """The split of one rank's slice of a fused weight tagged with ``split`` (that of the slice
    itself, or that of the whole TP = 1 matrix: both are accepted, told apart by row count)."""
    covered = sum(index.numel() for index in split.row_index())
    if covered == local_rows:
        return split
    if covered != local_rows * tp:
        raise ValueError(f"projection split {split} covers {covered} rows; a TP shard has {local_rows} "
                         f"(whole matrix {local_rows * tp})")
    if isinstance(split, roles.QKVSplit):
        return dataclasses.replace(split, num_groups=split.num_groups // tp)
    if isinstance(split, roles.GateUpSplit):
        return dataclasses.replace(split, ffn_size=split.ffn_size // tp)
    raise ValueError(f"no tensor-parallel layout known for a {type(split).__name__} weight")


def gathered_projection_rows(param: torch.nn.Parameter, local_rows: int, tp: int) -> list[torch.Tensor] | None:
    """Rows of each projection in the dim-0 concatenation of the ``tp`` slices of ``param``."""
    split = roles.projection_split(param)
    if split is None:
        return None
    local = shard_split(split, tp, local_rows).row_index()
    return [torch.cat([rank * local_rows + index for rank in range(tp)]) for index in local]


# weight -> (device, tp, local rows, gathered projection rows): built once, on the device
_ROWS: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def _rows_on(param: torch.nn.Parameter, local_rows: int, tp: int, device: torch.device):
    key = (device, tp, local_rows)
    cached = _ROWS.get(param)
    if cached is None or cached[0] != key:
        rows = gathered_projection_rows(param, local_rows, tp)
        cached = (key, None if rows is None else [index.to(device) for index in rows])
        _ROWS[param] = cached
    return cached[1]


def tensor_parallel_update(matrix: torch.Tensor, param: torch.nn.Parameter, *, steps: int = 5,
                           rule: ScaleRule = "match_rms_adamw") -> torch.Tensor:
    """:func:`~megatron_loop.optim.muon.orthogonalized_update` of this rank's slice ``matrix`` of
    ``param``, computed on the whole matrix gathered over the TP group.

    Collective over the TP group for sharded weights: every TP rank calls it for the same weights
    in the same order (their ZeRO partitions have identical layouts, as their shapes are equal).
    """
    tp = tensor_parallel_size()
    if tp == 1 or not is_tensor_parallel(param):
        return orthogonalized_update(matrix, param, steps=steps, rule=rule)
    from megatron.core import parallel_state

    dim = int(getattr(param, "partition_dim", 0))
    if matrix.ndim != 2 or dim not in (0, 1):
        raise ValueError(f"Muon: a TP-sharded weight must be 2-D, sharded on dim 0 or 1; got shape "
                         f"{tuple(matrix.shape)}, partition_dim {dim}")
    if getattr(param, "partition_stride", 1) != 1 and roles.projection_split(param) is None:
        raise ValueError("Muon: a strided TP shard needs its projection split (roles.set_role) to be regathered")
    group = parallel_state.get_tensor_model_parallel_group()
    shards = [torch.empty_like(matrix) for _ in range(tp)]
    dist.all_gather(shards, matrix.contiguous(), group=group)  # list form: gloo and nccl alike
    full = torch.cat(shards, dim=dim)
    rows = _rows_on(param, matrix.size(0), tp, matrix.device) if dim == 0 else None
    if dim == 1 and roles.projection_split(param) is not None:
        raise ValueError("Muon: a fused weight sharded on its columns has no known layout")
    update = orthogonalize_projections(full, rows, steps=steps, rule=rule)
    return update.chunk(tp, dim=dim)[parallel_state.get_tensor_model_parallel_rank()].contiguous()
