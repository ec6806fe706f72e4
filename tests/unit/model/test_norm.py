"""``model/norm.py``: the block spec's RMSNorm entry is torch's RMSNorm, exact on a sequence shard, its weight
marked ``sequence_parallel`` when the config shards the sequence (its gradient is then a TP partial sum)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from megatron_loop.model.norm import TorchRMSNorm


def test_the_spec_norm_is_torch_rmsnorm_and_marks_sequence_parallel_weights():
    norm = TorchRMSNorm(SimpleNamespace(sequence_parallel=True), hidden_size=6, eps=1e-6, persist_layer_norm=True)
    assert isinstance(norm, nn.RMSNorm) and norm.eps == 1e-6 and norm.weight.sequence_parallel is True
    assert TorchRMSNorm(SimpleNamespace(sequence_parallel=False), 6).weight.sequence_parallel is False
    x = torch.randn(4, 2, 6)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(norm(x[:2]), norm(x)[:2])  # a sequence shard: each token normalised alone
