"""``parallel/cpu.py``: megatron-core's sequence-parallel collectives allocate on the CPU in a process
without CUDA (the sequence-parallel runs on gloo: tests/integration/parallel/test_tp_equivalence.py)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.parallel.cpu import _TorchOnCPU, make_megatron_collectives_cpu_capable

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine nothing is changed")


def test_the_three_modules_see_the_cpu_as_current_device():
    from megatron.core import utils
    from megatron.core.tensor_parallel import layers, mappings

    make_megatron_collectives_cpu_capable()
    for module in (mappings, layers, utils):
        assert isinstance(module.torch, _TorchOnCPU)
        assert module.torch.cuda.current_device() == "cpu"
        assert module.torch.empty(2, device=module.torch.cuda.current_device()).device.type == "cpu"
        assert module.torch.float32 is torch.float32  # everything else is torch's own
    patched = mappings.torch
    make_megatron_collectives_cpu_capable()  # a second call keeps the same view
    assert mappings.torch is patched
