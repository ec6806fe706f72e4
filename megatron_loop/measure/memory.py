"""Peak memory of one call: what the memory model of activation recomputation
(``model/recompute.py``) and the benchmarks compare against."""

from __future__ import annotations

from typing import Callable

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from megatron_loop.measure.timing import synchronize


def peak_memory_delta(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated during one call of ``fn`` above what was allocated when it started.

    CUDA: ``max_memory_allocated`` after a reset. CPU: the running sum of the allocations made
    during the call and their frees, from ``torch.profiler`` (``profile_memory=True``) -- exact
    tensor bytes, independent of the malloc arena and of other processes (RSS is neither).
    Frees of blocks allocated before the call (last step's gradients under
    ``zero_grad(set_to_none=True)``) are not counted: torch's CPU allocator sizes them from a table
    that keeps stale entries of earlier profiled windows, so their sizes depend on address reuse
    and the measurement would vary from run to run. The CPU figure is therefore the peak of what
    the call itself allocates (gradients included), the quantity the memory model predicts.
    """
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:  # the allocation events sit at every depth of the op tree
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size < 0, node.extra_fields.ptr,
                           node.extra_fields.alloc_size))
    live: dict[int, int] = {}  # ptr -> bytes of the blocks allocated inside the window
    current = peak = 0
    for _, _, ptr, nbytes in sorted(events):  # at equal times an allocation precedes a free
        if nbytes > 0:
            live[ptr] = nbytes
        elif ptr in live:
            nbytes = -live.pop(ptr)
        else:
            continue  # allocated before the window
        current += nbytes
        peak = max(peak, current)
    return peak
