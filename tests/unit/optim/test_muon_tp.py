"""``optim/muon_tp.py``: Muon on tensor-parallel shards, the parts that need no TP group: the rows of each
projection in the gathered slices (QKV's are the TP = 1 matrix's rows; fc1's are the gate and up halves of
every rank's slice), a rank's split from the whole matrix's, and the update at TP = 1 (the whole-matrix
update; the gathered case: tests/integration/parallel/test_tp_optim.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from megatron_loop.model import roles
from megatron_loop.optim.muon import orthogonalized_update
from megatron_loop.optim.muon_tp import gathered_projection_rows, shard_split, tensor_parallel_update


def _param(rows: int, split) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(rows, 5))
    roles.set_role(p, roles.MATRIX, split)
    return p


def test_gathered_qkv_slices_hold_each_projection_at_its_tp1_rows():
    whole = roles.QKVSplit(num_groups=4, heads_per_group=2, head_dim=3)  # 4 x (2 + 2) x 3 = 48 rows
    for split in (whole, shard_split(whole, 2, 24)):  # tagged with the whole matrix's split, or with the slice's
        rows = gathered_projection_rows(_param(24, split), local_rows=24, tp=2)
        assert [r.tolist() for r in rows] == [r.tolist() for r in whole.row_index()]


def test_gathered_fc1_slices_hold_the_gate_and_up_half_of_every_rank():
    rows = gathered_projection_rows(_param(8, roles.GateUpSplit(8)), local_rows=8, tp=2)  # [g0; u0 | g1; u1]
    assert [r.tolist() for r in rows] == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert gathered_projection_rows(_param(8, None), 8, 2) is None  # one projection: no rows to keep apart


def test_a_split_that_fits_neither_the_slice_nor_the_whole_matrix_is_refused():
    with pytest.raises(ValueError, match=r"covers 48 rows; a TP shard has 10 \(whole matrix 20\)"):
        shard_split(roles.QKVSplit(4, 2, 3), 2, 10)


def test_at_tp_1_the_update_is_the_whole_matrix_update():
    torch.manual_seed(0)
    p = _param(48, roles.QKVSplit(4, 2, 3))
    g = torch.randn(48, 5)
    assert torch.equal(tensor_parallel_update(g, p), orthogonalized_update(g, p))
