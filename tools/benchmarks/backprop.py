"""``--mode backprop``: truncated backpropagation, ``backprop_loops`` 1, K/2 and K against the
full backward at K loops."""

from __future__ import annotations

import argparse
from typing import Callable

from .harness import Case, ModelFlops, Row, Setup, measure, release, speed_ratios
from .models import build, loop_shape, model_config
from .synthetic import random_tokens


def bench_backprop(setup: Setup, family: str, loops: int) -> list[Row]:
    """Forward + backward at K loops with ``backprop_loops`` N = 1, K/2, K and full (None), one model
    (channel initial injection, checkpointing off), side by side; FLOPs count the executed backward."""
    core = loop_shape(family)[0]
    cfg = model_config(setup, family, core, loops, initial_injection="channel")
    model, tokens = build(cfg, setup), random_tokens(cfg, setup)

    def step(n: int | None) -> Callable[[], None]:
        def run() -> None:
            model(tokens, labels=tokens, compute_logits=False, backprop_loops=n).loss.backward()
            model.zero_grad(set_to_none=True)
        return run

    windows = {"full": None, f"N={loops} (K)": loops, f"N={loops // 2} (K/2)": loops // 2, "N=1": 1}
    measured = measure({name: Case(step(n), tokens.numel(), ModelFlops(cfg, setup.seq, backprop_loops=n))
                        for name, n in windows.items()}, setup)
    rows = []
    for name, m in measured.items():
        m.update(time_vs_full=m["step_s"] / measured["full"]["step_s"],
                 peak_vs_full=m["peak_step_mib"] / measured["full"]["peak_step_mib"],
                 paired_speedup_vs_full=speed_ratios(m, measured["full"])["ratio_paired"])  # t_full / t
        rows.append(Row("backprop", f"{family} {core}x{loops} {name}", {"K": loops, "backprop_loops": windows[name]}, m))
    release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_backprop(setup, args.families[0], args.loops[-1])
