"""``--mode profile``: a torch.profiler table of one step of ``--config``'s model, top ops by self
time and their share of the step."""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from megatron_loop.config import build_model_config, load_config

from .harness import Row, Setup
from .models import CPU_WIDTHS, build, train_step
from .synthetic import random_tokens


def bench_profile(setup: Setup, config: str, top: int) -> list[Row]:
    """Where one forward + backward of ``--config``'s model (its checkpointing, compile setting of
    ``--compile``) spends its time: torch.profiler, ops by self time (CUDA kernels on GPU)."""
    values = dict(vars(load_config(config).model), compile=setup.compile)
    if not setup.cuda:
        values.update(CPU_WIDTHS, rope_scaling=None)
    cfg = build_model_config({k: v for k, v in values.items() if k != "backbone"})
    model = build(cfg, setup)
    tokens = random_tokens(cfg, setup)
    step = train_step(model, None, tokens)
    for _ in range(max(1, setup.warmup)):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.cuda else [])
    with profile(activities=activities) as prof:
        step()
        if setup.cuda:  # the kernels queued by the step belong to it
            torch.cuda.synchronize()
    attr = "self_device_time_total" if setup.cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(getattr(e, attr) for e in events)
    rows = []
    for e in sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:top]:
        rows.append(Row("profile", e.key, {}, {"self_ms": getattr(e, attr) / 1e3, "share": getattr(e, attr) / total,
                                              "calls": e.count}))
    rows.append(Row("profile", "total (one step)", {"config": config}, {"self_ms": total / 1e3, "share": 1.0}))
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_profile(setup, args.config, args.top)
