"""``measure/peak_flops.py``: the MFU denominator, which the training loop and tools/bench.py both take
from here: the configured peak, the published H100/H200 dense bf16 peak on CUDA, else a measured
matmul rate (its arithmetic against stated times; the probe's own size and repetitions)."""

from __future__ import annotations

import math

import torch

from megatron_loop.flops import H100_BF16_PEAK_FLOPS
from megatron_loop.measure import peak_flops
from megatron_loop.measure.peak_flops import matmul_peak_flops, peak_flops_per_device


def test_a_configured_peak_wins_on_any_device():
    for device in ("cpu", "cuda"):
        assert peak_flops_per_device(torch.device(device), 312.5) == (312.5e12, "312.5 TFLOP/s (logging.peak_tflops)")


def test_cuda_uses_the_published_dense_bf16_peak_without_measuring(monkeypatch):
    monkeypatch.setattr(peak_flops, "matmul_peak_flops", lambda *a, **k: 1 / 0)  # must not be called
    assert H100_BF16_PEAK_FLOPS == 989e12
    assert peak_flops_per_device(torch.device("cuda")) == (989e12, "989 TFLOP/s (H100/H200 dense bf16)")


def test_cpu_measures_one_fp32_512_cubed_product_best_of_8(monkeypatch):
    asked = []

    def measured(device, dtype, size, reps):
        asked.append((device, dtype, size, reps))
        return 41.25e9

    monkeypatch.setattr(peak_flops, "matmul_peak_flops", measured)
    assert peak_flops_per_device(torch.device("cpu")) == (41.25e9, "measured fp32 512^3 matmul: 41.2 GFLOP/s")
    assert asked == [(torch.device("cpu"), torch.float32, 512, 8)]


def test_matmul_rate_is_two_n_cubed_over_the_fastest_call(monkeypatch):
    calls = []

    def timed(fn, device, steps, warmup):
        calls.append((steps, warmup, tuple(fn().shape)))
        return [0.5, 0.25, 0.4]

    monkeypatch.setattr(peak_flops, "time_calls", timed)
    assert matmul_peak_flops(torch.device("cpu"), torch.float32, size=64, reps=3) == 2 * 64**3 / 0.25
    assert calls == [(3, 2, (64, 64))]  # the timed call is the size x size product, after 2 warm-ups
    monkeypatch.undo()
    real = matmul_peak_flops(torch.device("cpu"), torch.float32, size=64, reps=2)
    assert math.isfinite(real) and real > 1e6  # a real CPU does more than a MFLOP/s
