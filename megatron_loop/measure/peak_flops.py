"""The MFU denominator: the published dense bf16 peak on GPU, else a measured dense matmul rate."""

from __future__ import annotations

import torch

from megatron_loop.flops import H100_BF16_PEAK_FLOPS
from megatron_loop.measure.timing import time_calls


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, reps: int = 30) -> float:
    """Measured dense matmul FLOP/s (best of ``reps``): the MFU denominator where no published
    peak applies (CPUs). Timing the same shapes as a GEMM-bound model keeps it comparable."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    times = time_calls(lambda: a @ a, device, reps, warmup=2)
    return 2 * size**3 / min(times)


def peak_flops_per_device(device: torch.device, peak_tflops: float | None = None) -> tuple[float, str]:
    """The MFU denominator and its description: ``peak_tflops`` when given (``logging.peak_tflops``),
    the H100/H200 dense bf16 peak on CUDA, else the measured fp32 matmul rate of one 512^3 product,
    best of 8 (CPUs have no published per-core peak; a probe slowed by a busy neighbour must not
    understate it). The training loop and ``tools/bench.py`` both take it from here."""
    if peak_tflops is not None:
        return peak_tflops * 1e12, f"{peak_tflops:g} TFLOP/s (logging.peak_tflops)"
    if device.type == "cuda":
        return H100_BF16_PEAK_FLOPS, "989 TFLOP/s (H100/H200 dense bf16)"
    peak = matmul_peak_flops(device, torch.float32, size=512, reps=8)
    return peak, f"measured fp32 512^3 matmul: {peak / 1e9:.1f} GFLOP/s"
