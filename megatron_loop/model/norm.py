"""The RMSNorm of the block spec (megatron-core ``ModuleSpec`` entry).

megatron-core's ``WrappedTorchNorm`` refuses sequence parallelism (its norms are Transformer
Engine's or Apex's there); a torch ``RMSNorm`` is exact on a sequence shard (it normalises each
token over the hidden dimension), so this entry allows it and marks the weight with
megatron-core's ``sequence_parallel`` attribute: its gradient is then a partial sum over the TP
group (``parallel.grads``).
"""

from __future__ import annotations

from torch import nn


class TorchRMSNorm:
    """``torch.nn.RMSNorm(hidden_size, eps)``, built from a megatron-core ``TransformerConfig``."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused) -> nn.RMSNorm:
        norm = nn.RMSNorm(hidden_size, eps=eps)
        norm.weight.sequence_parallel = bool(config.sequence_parallel)
        return norm
