"""``--mode compile``: eager vs torch.compile'd blocks, and the graphs compiled when the loop
count r changes (must be 0)."""

from __future__ import annotations

import argparse

import torch
from torch._dynamo.utils import counters

from .harness import Case, ModelFlops, Row, Setup, measure, release, speed_ratios
from .models import build, full_step, loop_shape, model_config
from .synthetic import random_tokens


def bench_compile(setup: Setup, family: str) -> list[Row]:
    """Eager vs ``model.compile=true`` (inductor) side by side on the loop model, and the number
    of graphs dynamo compiled before and after evaluating at other loop counts r."""
    core, loops = loop_shape(family)
    cases = {}
    for compiled in (False, True):
        cfg = model_config(setup, family, core, loops, compile=compiled)
        model = build(cfg, setup)
        tokens = random_tokens(cfg, setup)
        cases["compiled" if compiled else "eager"] = Case(full_step(model, cfg, setup, tokens),
                                                          tokens.numel(), ModelFlops(cfg, setup.seq))
    measured = measure(cases, setup)
    measured["compiled"].update(speed_ratios(measured["compiled"], measured["eager"]))
    graphs_after_training = counters["stats"]["unique_graphs"]
    with torch.no_grad():  # the last model built is the compiled one
        model(tokens, num_loops=loops)  # evaluation graphs (no autograd) at r = K ...
        graphs_at_k = counters["stats"]["unique_graphs"]
        for r in (1, 2 * loops, 3 * loops + 1):  # ... then at other r: no new graph
            model(tokens, num_loops=r)
    measured["compiled"].update(graphs_train=graphs_after_training, graphs_eval_r_K=graphs_at_k,
                                new_graphs_other_r=counters["stats"]["unique_graphs"] - graphs_at_k)
    del model, cases
    release(setup)
    return [Row("compile", f"{family} {core}x{loops} {name}", {}, m) for name, m in measured.items()]


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_compile(setup, args.families[0])
