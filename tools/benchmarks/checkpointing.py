"""``--mode checkpointing``: activation recomputation none / per_loop / selective / auto /
per_block across K, step time and step peak memory side by side."""

from __future__ import annotations

import argparse

from megatron_loop.config import RECOMPUTE_MODES, ModelConfig
from megatron_loop.flops import hardware_flops_per_token
from megatron_loop.model.recompute import FULL, NONE, loop_memory, predicted_peak

from .harness import Case, ModelFlops, Row, Setup, fits, measure, release
from .models import build, loop_shape, model_config, train_step
from .synthetic import random_tokens

def midway_budget_gib(cfg: ModelConfig, setup: Setup, loops: int) -> float:
    """Halfway between per_loop's and none's peak, as the memory model predicts them."""
    params = build(cfg, setup).num_parameters() * setup.dtype.itemsize
    mem = loop_memory(cfg, setup.micro_batch, setup.seq, setup.dtype.itemsize, 4096, params)
    low = predicted_peak((FULL,) * (loops - 1) + (NONE,), mem)
    return (low + predicted_peak((NONE,) * loops, mem)) / 2 / 2**30


def bench_checkpointing(setup: Setup, family: str, loops_list: list[int], ac_budget_gib: float | None = None,
                        modes: tuple[str, ...] = RECOMPUTE_MODES, reference_micro_batch: int | None = None) -> list[Row]:
    """Every checkpointing mode at each K: step time (forward + backward) and step peak memory.

    ``auto`` runs with ``--ac-budget-gib`` (default: halfway between per_loop's and none's peak as
    the memory model predicts them), so the planner has to mix loop kinds.

    ``reference_micro_batch``: the unconstrained reference (``none``) runs at this micro-batch (one
    that fits without checkpointing, e.g. 8 when the paper's 38 does not), so ``time_vs_none`` is
    per token: tokens/s of none over tokens/s of the mode (the step ratio at equal micro-batches).

    Per-loop checkpointing should add one stored loop input ``h_l`` ([seq, batch, hidden]) per
    extra loop; ``loop_inputs_per_loop`` is the peak's growth per loop in those units. A mode whose
    step runs out of device memory is reported as such (``fits: false``) and left out of the timing.
    """
    rows = []
    core = loop_shape(family)[0]
    for loops in loops_list:
        cases, cfgs, plans, micro, too_big = {}, {}, {}, {}, []
        for mode in modes:
            extra = {}
            if mode == "auto":
                extra["recompute_budget_gib"] = ac_budget_gib or midway_budget_gib(
                    model_config(setup, family, core, loops), setup, loops)
            cfg = cfgs[mode] = model_config(setup, family, core, loops, recompute=mode, **extra)
            model = build(cfg, setup)
            tokens = random_tokens(cfg, setup, reference_micro_batch if mode == "none" else None)
            micro[mode] = tokens.shape[0]
            step = train_step(model, None, tokens)
            if not fits(step, model, setup):  # one untimed step (auto: plans the loops)
                too_big.append(mode)
                continue
            cases[mode] = Case(step, tokens.numel(), ModelFlops(cfg, setup.seq))
            if mode == "auto":
                plans[mode] = next(iter(model.recompute.schedules.values()))
        measured = measure(cases, setup)
        for mode in modes:
            name = f"{family} {core}x{loops} {mode}" + (f" (micro-batch {micro[mode]})"
                                                        if micro[mode] != setup.micro_batch else "")
            params = {"K": loops, "mode": mode, "micro_batch": micro[mode]}
            if mode in too_big:
                rows.append(Row("checkpointing", name, params, {"fits": False}))
                continue
            m = measured[mode]
            if "none" in measured:  # per token: the reference may run another micro-batch
                m["time_vs_none"] = measured["none"]["tokens_per_s"] / m["tokens_per_s"]
            # hardware TFLOP/s: model FLOPs plus the recomputed forward
            full = sum(k == "full" for k in plans[mode].kinds) if mode in plans else None
            m["hw_tflops"] = m["tokens_per_s"] * hardware_flops_per_token(cfgs[mode], setup.seq,
                                                                          full_loops=full) / 1e12
            m["loop_input_mib"] = micro[mode] * setup.seq * cfgs[mode].hidden_size * setup.dtype.itemsize / 2**20
            if mode in plans:
                m["plan"] = "/".join(k[0] for k in plans[mode].kinds)  # n(one) s(elective) f(ull) per loop
                m["predicted_peak_mib"] = plans[mode].peak_bytes / 2**20
                m["budget_mib"] = cfgs[mode].recompute_budget_gib * 1024
            rows.append(Row("checkpointing", name, params, m))
        del cases
        release(setup)
    rows += peak_growth_per_loop(rows, modes)
    return rows


def peak_growth_per_loop(rows: list[Row], modes: tuple[str, ...]) -> list[Row]:
    """Per mode, the step peak's growth per added loop between the smallest and the largest K."""
    out = []
    for mode in modes:
        pts = [(r.params["K"], r.metrics) for r in rows
               if r.params.get("mode") == mode and "peak_step_mib" in r.metrics]
        if len(pts) >= 2:
            (k0, m0), (k1, m1) = pts[0], pts[-1]
            per_loop = (m1["peak_step_mib"] - m0["peak_step_mib"]) / (k1 - k0)
            out.append(Row("checkpointing", f"{mode}: peak growth per added loop (K={k0}..{k1})", {},
                           {"mib_per_loop": per_loop, "loop_inputs_per_loop": per_loop / m0["loop_input_mib"]}))
    return out


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_checkpointing(setup, args.families[0], args.loops, args.ac_budget_gib,
                               tuple(args.ac_modes.split(",")), args.ac_reference_micro_batch)
