"""Measured peak FLOP/s of a device (dense matmul), the MFU denominator where no published peak applies."""

from __future__ import annotations

import torch

from megatron_loop.measure.timing import time_calls


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, reps: int = 30) -> float:
    """Measured dense matmul FLOP/s (best of ``reps``): the MFU denominator where no published
    peak applies (CPUs). Timing the same shapes as a GEMM-bound model keeps it comparable."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    times = time_calls(lambda: a @ a, device, reps, warmup=2)
    return 2 * size**3 / min(times)
