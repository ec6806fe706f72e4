"""``model/roles.py``: each parameter's role and how a fused matrix splits into its projections, exact row
indices for megatron-core's layouts (the optimizer groups built from them: tests/unit/optim/test_muon.py)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.model import roles
from megatron_loop.model.roles import (CONDITIONING, MATRIX, NORM, GateUpSplit, QKVSplit, StackSplit,
                                       is_conditioning_matrix, projection_rows, role_of, set_conditioning_matrix,
                                       set_role, tag_all, uses_muon)


def test_qkv_rows_per_query_group():
    # 2 query groups of 2 heads each, head_dim 3: per group [q q (6 rows), k (3), v (3)] = 12 rows
    q, k, v = QKVSplit(num_groups=2, heads_per_group=2, head_dim=3).row_index()
    assert q.tolist() == [0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17]
    assert k.tolist() == [6, 7, 8, 18, 19, 20]
    assert v.tolist() == [9, 10, 11, 21, 22, 23]
    assert sorted(torch.cat([q, k, v]).tolist()) == list(range(24))  # every row once


def test_gate_up_and_stack_rows():
    gate, up = GateUpSplit(ffn_size=3).row_index()
    assert (gate.tolist(), up.tolist()) == ([0, 1, 2], [3, 4, 5])
    assert [r.tolist() for r in StackSplit(count=3, rows=2).row_index()] == [[0, 1], [2, 3], [4, 5]]


def test_roles_decide_muon():
    w, n, dense = (torch.nn.Parameter(torch.zeros(4, 4)) for _ in range(3))
    set_role(w, MATRIX, GateUpSplit(2))
    set_role(n, NORM)
    set_conditioning_matrix(dense, StackSplit(count=2, rows=2))
    assert (role_of(w), role_of(n), role_of(dense)) == (MATRIX, NORM, CONDITIONING)
    assert uses_muon(w) and not uses_muon(n) and not uses_muon(dense)  # App. C.2's reading by default
    assert uses_muon(dense, conditioning_matrices=True) and not uses_muon(n, conditioning_matrices=True)
    assert is_conditioning_matrix(dense) and not is_conditioning_matrix(w)
    assert [r.tolist() for r in projection_rows(w)] == [[0, 1], [2, 3]] and projection_rows(n) is None


def test_untagged_and_unknown_roles_are_refused():
    with pytest.raises(ValueError) as err:
        role_of(torch.nn.Parameter(torch.zeros(2, 3)))
    assert str(err.value) == "parameter of shape (2, 3) has no role; every model parameter must be tagged"
    with pytest.raises(ValueError) as err:
        set_role(torch.nn.Parameter(torch.zeros(1)), "bias")
    assert str(err.value) == f"unknown parameter role 'bias'; expected one of {roles.ROLES}"


def test_tag_all_tags_every_parameter_of_a_module():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    tag_all(module, CONDITIONING)
    assert {role_of(p) for p in module.parameters()} == {CONDITIONING}
    assert not any(is_conditioning_matrix(p) for p in module.parameters())  # plain conditioning: AdamW always
