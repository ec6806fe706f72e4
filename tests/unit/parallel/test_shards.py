"""``parallel/shards.py``: a whole tensor cut into a rank's tensor-parallel shard by megatron-core's partition
attributes and put back together, exact block by block (the all-gather over a real TP group:
tests/support/dist_scripts/tp_*.py via tests/integration/parallel/)."""

from __future__ import annotations

import torch

from megatron_loop.parallel.shards import shard_of, whole_of


def _param(shape, dim=None, stride=1):
    p = torch.nn.Parameter(torch.zeros(shape))
    if dim is not None:  # the attributes megatron-core's TP layers set
        p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, stride
    return p


def test_stride_one_rows_and_columns():
    full = torch.arange(24.0).view(4, 6)
    rows = _param((2, 6), dim=0)
    assert torch.equal(shard_of(full, rows, 1, 2), full[2:])
    cols = _param((4, 2), dim=1)
    assert torch.equal(shard_of(full, cols, 2, 3), full[:, 4:])
    for p, size in ((rows, 2), (cols, 3)):
        assert torch.equal(whole_of([shard_of(full, p, r, size) for r in range(size)], p), full)


def test_swiglu_fc1_stride_two_holds_gate_and_up_of_each_rank():
    gate, up = torch.arange(8.0).view(4, 2), 100 + torch.arange(8.0).view(4, 2)
    full = torch.cat([gate, up])  # [gate; up], 8 rows
    fc1 = _param((4, 2), dim=0, stride=2)
    assert torch.equal(shard_of(full, fc1, 0, 2), torch.cat([gate[:2], up[:2]]))  # [gate_0; up_0]
    assert torch.equal(shard_of(full, fc1, 1, 2), torch.cat([gate[2:], up[2:]]))
    assert torch.equal(whole_of([shard_of(full, fc1, r, 2) for r in range(2)], fc1), full)


def test_replicated_tensors_and_one_rank_are_unchanged():
    full = torch.randn(3, 3)
    assert shard_of(full, _param((3, 3)), 1, 2) is full
    assert shard_of(full, _param((3, 3), dim=0), 0, 1) is full
    assert whole_of([full, full.clone()], _param((3, 3))) is full
