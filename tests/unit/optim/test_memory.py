"""``optim/memory.py``: the optimizer state the first step will create, counted before it exists (Muon's
momentum, AdamW's two moments); the DeepSpeed gradient buckets are read from a real engine by
tests/support/perf_scripts/zero_engine.py (tests/integration/training/test_zero_engine.py)."""

from __future__ import annotations

import torch

from megatron_loop.optim.memory import unallocated_optimizer_state
from megatron_loop.optim.optimizer import MuonAdamW


def test_state_not_created_yet_then_none():
    w = torch.nn.Parameter(torch.randn(8, 4))  # Muon: one 8x4 fp32 momentum = 128 bytes
    b = torch.nn.Parameter(torch.randn(8))  # AdamW: two 8-element fp32 moments = 64 bytes
    h = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))  # AdamW in float64: 2 x 48 bytes
    optimizer = MuonAdamW([{"params": [w], "muon": True}, {"params": [b, h], "muon": False}], lr=0.01)
    assert unallocated_optimizer_state(optimizer) == 128 + 64 + 96
    (w.sum() + b.sum() + h.sum()).backward()
    optimizer.step()
    assert unallocated_optimizer_state(optimizer) == 0  # every state tensor exists now
