"""``--mode recompute``: what recomputation costs under each per-loop checkpointing kind, in
forwards of the recomputed loop (the cost the ``auto`` planner ranks plans by)."""

from __future__ import annotations

import argparse

from .harness import Case, ModelFlops, Row, Setup, measure, release
from .models import build, loop_shape, model_config, train_step
from .synthetic import random_tokens

RECOMPUTED_KINDS = ("selective", "per_loop")  # the per-loop checkpointing kinds that recompute


def bench_recompute(setup: Setup, family: str, loops: int) -> list[Row]:
    """What recomputation costs, in forwards of the loop it recomputes (the unit of the ``auto``
    planner's cost of a loop kind, ``megatron_loop/model/recompute.py``).

    One model per mode (same weights) at K loops; every per-loop mode recomputes K - 1 loops (the
    last never), so for each kind ``recompute_cost`` = (t_step(kind) - t_step(none)) / ((K - 1) t_loop),
    where t_loop, one loop's forward, is (t_forward(r=K) - t_forward(r=1)) / (K - 1) of the ``none``
    model (forward with autograd recording, no backward). ``per_loop`` recomputes a whole loop, so its
    cost should come out near 1 (a check of the method); ``selective``'s is the measured figure for
    the planner. ``backward_vs_none``: the step minus the forward, against none's (the backward with
    recomputation over the backward without). Steps are forward + backward, timed interleaved.
    """
    core = loop_shape(family)[0]
    cases: dict[str, Case] = {}
    for mode in ("none", *RECOMPUTED_KINDS):
        cfg = model_config(setup, family, core, loops, recompute=mode)
        model = build(cfg, setup)
        tokens = random_tokens(cfg, setup)
        cases[mode] = Case(train_step(model, None, tokens), tokens.numel(), ModelFlops(cfg, setup.seq), memory=False)
        if mode == "none":
            for r in (loops, 1):
                cases[f"forward r={r}"] = Case(
                    lambda model=model, tokens=tokens, r=r: model(tokens, num_loops=r, labels=tokens,
                                                                  compute_logits=False),
                    tokens.numel(), memory=False)
    measured = measure(cases, setup)
    forward = measured[f"forward r={loops}"]["step_s"]
    loop_s = (forward - measured["forward r=1"]["step_s"]) / (loops - 1)
    rows = [Row("recompute", f"{family} {core}x{loops} forward, one loop", {"K": loops},
                {"step_s": loop_s, "forward_s": forward})]
    for mode in ("none", *RECOMPUTED_KINDS):
        m = measured[mode]
        extra = m["step_s"] - measured["none"]["step_s"]
        m.update(extra_s=extra, recompute_cost=extra / ((loops - 1) * loop_s) if mode != "none" else 0.0,
                 backward_vs_none=(m["step_s"] - forward) / (measured["none"]["step_s"] - forward))
        rows.append(Row("recompute", f"{family} {core}x{loops} {mode}", {"K": loops, "mode": mode}, m))
    release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_recompute(setup, args.families[0], args.loops[-1])
