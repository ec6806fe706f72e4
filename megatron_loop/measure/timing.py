"""Wall-clock timing of calls on a device: synchronised at the boundaries, interleaved between
configurations so that a shared, noisy machine loads each of them alike."""

from __future__ import annotations

import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (timing boundaries only; never inside a step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, steps: int,
                     warmup: int) -> dict[str, list[float]]:
    """Wall-clock seconds of ``steps`` calls of each function, after ``warmup`` untimed calls each.

    The functions take turns (a, b, a, b, ...), so on a shared, noisy machine every
    configuration sees the same background load and their ratios stay meaningful.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def time_calls(fn: Callable[[], object], device: torch.device, steps: int, warmup: int) -> list[float]:
    """Wall-clock seconds of ``steps`` calls of ``fn`` after ``warmup`` untimed calls."""
    return time_interleaved({"fn": fn}, device, steps, warmup)["fn"]
