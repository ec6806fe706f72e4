"""Where and at what size a run measures, and the one timing helper every mode uses.

Every measurement helper the benchmarks take from ``megatron_loop.measure`` is imported here (the
timer, the peak-memory and host-sync probes, the measured CPU matmul peak).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

from megatron_loop.config import ModelConfig
from megatron_loop.flops import mfu
from megatron_loop.measure.host_sync import count_host_syncs
from megatron_loop.measure.memory import peak_memory_delta
from megatron_loop.measure.peak_flops import peak_flops_per_device
from megatron_loop.measure.timing import time_interleaved


@dataclass
class Setup:
    """Where and at what size a run measures."""

    device: torch.device
    dtype: torch.dtype
    seq: int
    micro_batch: int
    steps: int
    warmup: int
    compile: bool
    peak_flops: float
    peak_label: str
    engine: str = "plain"  # full steps: "plain" (model + MuonAdamW) or "deepspeed" (the training path)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass
class Row:
    """One measured configuration."""

    mode: str
    case: str
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


def fail(message: str) -> None:
    """A bad argument: one ``error:`` line, exit code 2 (docs/ERRORS.md)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def make_setup(args: argparse.Namespace) -> Setup:
    """The device, dtype, sizes and MFU peak of ``tools/bench.py``'s arguments (CUDA: the paper's
    sequence length in bf16; CPU: short sequences in fp32 against a measured matmul peak)."""
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device visible")
    device = torch.device("cuda" if cuda else "cpu")
    if args.engine == "deepspeed" or "train" in args.mode.split(","):
        from megatron_loop.parallel.bootstrap import init_world  # deepspeed: only the modes that use it

        init_world()  # before any model: DeepSpeed needs the process group it initialises itself
    if not cuda:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if cuda else torch.float32
    peak, label = peak_flops_per_device(device)  # as the training loop's MFU
    if not cuda:
        label += f", {args.threads} thread(s)"
    return Setup(device=device, dtype=dtype, seq=args.seq or (2048 if cuda else 128),
                 micro_batch=args.micro_batch or (8 if cuda else 4), steps=args.steps or (10 if cuda else 9),
                 warmup=args.warmup if args.warmup is not None else (3 if cuda else 1), compile=args.compile,
                 peak_flops=peak, peak_label=label, engine=args.engine)


@dataclass
class ModelFlops:
    """Which model's training FLOPs a case's tokens cost (``megatron_loop.flops``): at ``num_loops``
    loops (None: its ``train_loops``), backward through the last ``backprop_loops`` (None: all)."""

    cfg: ModelConfig
    seq_length: int
    num_loops: int | None = None
    backprop_loops: int | None = None


@dataclass
class Case:
    """A step to time: what it runs, how many tokens it consumes, whose model FLOPs they cost."""

    step: Callable[[], None]
    tokens: int
    flops: ModelFlops | None = None
    memory: bool = True
    check_syncs: bool = False  # CUDA: count synchronising calls in one step (target: 0 in the model)


def measure(cases: dict[str, Case], setup: Setup) -> dict[str, dict]:
    """Time every case side by side (interleaved), then measure each one's step peak memory."""
    times = time_interleaved({name: c.step for name, c in cases.items()}, setup.device, setup.steps, setup.warmup)
    out = {}
    for name, case in cases.items():
        median = statistics.median(times[name])
        m = {"step_s": median, "step_s_min": min(times[name]), "tokens_per_s": case.tokens / median,
             "_step_times": times[name]}
        if case.flops is not None:
            f = case.flops
            utilisation = mfu(m["tokens_per_s"], f.cfg, f.seq_length, setup.peak_flops, f.num_loops,
                              f.backprop_loops)
            m["tflops"] = utilisation * setup.peak_flops / 1e12
            m["mfu" if setup.cuda else "mfu_vs_matmul"] = utilisation
        if case.memory:
            m["peak_step_mib"] = peak_memory_delta(case.step, setup.device) / 2**20
        if case.check_syncs:  # CUDA: sync debug mode; CPU: measure.host_sync.HostSyncDetector (aten-level reads)
            where: list[str] = []
            m["host_syncs"] = count_host_syncs(case.step, setup.device, where)
            if where:
                m["host_sync_sites"] = sorted(set(where))
        out[name] = m
    return out


def speed_ratios(a: dict, b: dict) -> dict:
    """Throughput of ``a`` over ``b`` (equal tokens per step), three ways from one interleaved run:
    ratio of medians; ratio of best steps (the least disturbed); and ``ratio_paired``, the median
    over rounds of the ratio of the two steps timed back to back (most robust to load bursts
    on a shared machine, which hit both members of a pair alike)."""
    paired = statistics.median(tb / ta for ta, tb in zip(a["_step_times"], b["_step_times"]))
    return {"tokens_per_s_ratio": b["step_s"] / a["step_s"], "ratio_best_steps": b["step_s_min"] / a["step_s_min"],
            "ratio_paired": paired}


def paired_ratios(a: dict, b: dict) -> dict:
    """``harness.speed_ratios`` of ``a`` over ``b`` (speed, > 1: ``a`` faster) with the interquartile
    range of the per-round paired ratio."""
    paired = [tb / ta for ta, tb in zip(a["_step_times"], b["_step_times"])]
    q1, _, q3 = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else paired * 3
    return {**speed_ratios(a, b), "ratio_paired_q1": q1, "ratio_paired_q3": q3}


def release(setup: Setup) -> None:
    """Give cached device memory back between modes, so the next one's peak starts clean."""
    if setup.cuda:
        torch.cuda.empty_cache()


def fits(step: Callable[[], None], model: torch.nn.Module, setup: Setup) -> bool:
    """One untimed call of ``step``; False (its memory given back) if it ran out of device memory."""
    try:
        step()
    except torch.cuda.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        release(setup)
        return False
    return True
