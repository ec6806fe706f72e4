"""``--mode optimizer``: Muon+AdamW vs AdamW step time as a fraction of an accumulated global-batch
step, measured and extrapolated to the paper's global batch."""

from __future__ import annotations

import argparse

from .harness import Case, Row, Setup, measure, release
from .models import adamw, build, forward_backward, loop_shape, model_config, muon_adamw, train_step
from .synthetic import random_tokens

PAPER_GLOBAL_BATCH = 1824  # sequences of 2048 tokens (App. C.2): 38 micro x 6 accumulation x 8 ranks
PAPER_DATA_PARALLEL = 8


def bench_optimizer(setup: Setup, family: str, accumulation: int) -> list[Row]:
    """Optimizer-step time against an accumulated step; extrapolated to the paper's global batch.

    The optimizer step is timed on its own (gradients in place, as after the last micro-batch),
    the two optimizers side by side; forward + backward per sequence comes from the same model.
    The measured fraction is t_opt / t_step of a real ``accumulation``-micro-batch step; the
    extrapolated one at global batch G over D data-parallel ranks is t_opt / (t_opt + t_seq G / D),
    with the whole model's optimizer step on each rank (an upper bound: ZeRO shards AdamW, and
    Muon's Newton-Schulz is the same work per rank at worst).
    """
    core, loops = loop_shape(family)
    cfg = model_config(setup, family, core, loops, recompute="per_loop" if setup.cuda else "none")
    model = build(cfg, setup)
    tokens = random_tokens(cfg, setup)
    forward_backward(model, tokens)  # gradients in place for the optimizer-only timings
    optimizers = {"muon+adamw": muon_adamw(model), "adamw": adamw(model)}
    for opt in optimizers.values():
        opt.step()  # create the state outside the timing
    cases = {"forward+backward": Case(lambda: forward_backward(model, tokens), tokens.numel(), memory=False)}
    cases.update({f"{n} step": Case(opt.step, tokens.numel(), memory=False) for n, opt in optimizers.items()})
    measured = measure(cases, setup)
    full = measure({n: Case(train_step(model, opt, tokens, accumulation), tokens.numel() * accumulation,
                            memory=False) for n, opt in optimizers.items()}, setup)
    t_seq = measured["forward+backward"]["step_s"] / setup.micro_batch
    rows = [Row("optimizer", f"{family} {core}x{loops} forward+backward", {"micro_batch": setup.micro_batch},
                {"step_s": measured["forward+backward"]["step_s"], "s_per_sequence": t_seq})]
    per_device = PAPER_GLOBAL_BATCH / PAPER_DATA_PARALLEL
    for name in optimizers:
        t_opt = measured[f"{name} step"]["step_s"]
        rows.append(Row("optimizer", f"{family} {core}x{loops} {name}",
                        {"accumulation": accumulation, "extrapolated": not setup.cuda or setup.seq != 2048},
                        {"step_s": t_opt, "full_step_s": full[name]["step_s"],
                         f"measured_fraction_accum{accumulation}": t_opt / full[name]["step_s"],
                         "fraction_G1824_8ranks": t_opt / (t_opt + t_seq * per_device),
                         "fraction_G1824_1rank": t_opt / (t_opt + t_seq * PAPER_GLOBAL_BATCH)}))
    del model, optimizers, cases
    release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_optimizer(setup, args.families[0], args.accumulation or (6 if setup.cuda else 4))
