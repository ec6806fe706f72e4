"""megatron-core's tensor-parallel collectives on CPU (gloo).

The sequence-parallel all-gathers and reduce-scatters of megatron-core (``tensor_parallel.mappings``,
the sequence-parallel path of ``ColumnParallelLinear``/``RowParallelLinear`` and their shared
``GlobalMemoryBuffer``) allocate their output with ``device=torch.cuda.current_device()``; the
collectives themselves (``all_gather_into_tensor``, ``reduce_scatter_tensor``) run on gloo. In a
process without CUDA we point the ``torch`` those three modules see at a view of torch whose
``cuda.current_device()`` is the CPU; on a CUDA machine nothing changes.
"""

from __future__ import annotations

import types
import warnings

import torch


class _CPUCurrentDevice(types.SimpleNamespace):
    """``torch.cuda`` with ``current_device()`` answering ``"cpu"`` (everything else forwarded)."""

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"


class _TorchOnCPU:
    """The ``torch`` module, except that ``torch.cuda.current_device()`` is the CPU."""

    cuda = _CPUCurrentDevice()

    def __getattr__(self, name: str):
        return getattr(torch, name)


def make_megatron_collectives_cpu_capable() -> None:
    """Let megatron-core's sequence-parallel collectives allocate on the CPU when there is no CUDA."""
    if torch.cuda.is_available():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import utils
        from megatron.core.tensor_parallel import layers, mappings
    for module in (mappings, layers, utils):
        if not isinstance(module.torch, _TorchOnCPU):
            module.torch = _TorchOnCPU()
