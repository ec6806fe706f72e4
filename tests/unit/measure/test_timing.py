"""``measure/timing.py``: interleaved wall-clock timing (the benchmarks that use it: tests/integration/tools/
test_bench.py)."""

from __future__ import annotations

import time

import torch

from megatron_loop.measure.timing import synchronize, time_calls, time_interleaved


def test_calls_take_turns_after_the_warmup():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = time_interleaved(fns, torch.device("cpu"), steps=3, warmup=2)
    assert order == ["a", "b"] * 5  # 2 warmup rounds, then 3 timed rounds, a and b alternating
    assert sorted(times) == ["a", "b"] and [len(v) for v in times.values()] == [3, 3]
    assert all(t >= 0 for v in times.values() for t in v)


def test_each_timing_covers_its_call():
    times = time_calls(lambda: time.sleep(0.02), torch.device("cpu"), steps=2, warmup=0)
    assert len(times) == 2 and all(0.02 <= t < 1.0 for t in times)


def test_synchronize_on_cpu_is_a_no_op():
    assert synchronize(torch.device("cpu")) is None
