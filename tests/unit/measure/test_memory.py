"""``measure/memory.py``: the peak bytes one call allocates above its start, on CPU from torch's profiler
(exact tensor bytes); what the recomputation memory model is compared with in tests/unit/model/
test_recompute.py."""

from __future__ import annotations

import torch

from megatron_loop.measure.memory import peak_memory_delta

CPU = torch.device("cpu")


def test_peak_is_the_largest_sum_of_live_allocations():
    def call():
        a = torch.empty(1024)  # 4 KiB
        b = torch.empty(2048)  # 8 KiB: 12 KiB live
        del a
        c = torch.empty(512)  # 2 KiB: 10 KiB live
        return b, c

    assert peak_memory_delta(call, CPU) == 12 * 1024


def test_frees_of_blocks_allocated_before_the_call_are_not_counted():
    held = [torch.empty(4096)]  # 16 KiB allocated before the window

    def call():
        held.pop()  # freed inside the window: not subtracted
        x = torch.empty(256)  # 1 KiB
        del x

    assert peak_memory_delta(call, CPU) == 1024


def test_nothing_allocated_is_zero():
    assert peak_memory_delta(lambda: None, CPU) == 0
