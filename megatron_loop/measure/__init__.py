"""Measurement helpers for benchmarks and tests, one job per module.

* :mod:`.timing` -- wall-clock timing of calls (interleaved, device-synchronised at the boundaries).
* :mod:`.memory` -- peak bytes one call allocates (CUDA allocator statistics, or torch's CPU profiler).
* :mod:`.peak_flops` -- measured dense-matmul FLOP/s, the MFU denominator where no published peak applies.
* :mod:`.host_sync` -- the calls that make the host wait for the device (CPU detector, CUDA sync debug mode).
"""
