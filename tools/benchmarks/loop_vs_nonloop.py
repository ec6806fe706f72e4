"""``--mode loop-vs-nonloop``: LoopLM vs NonLoop at equal effective depth (Llama 4x5 vs 20x1,
Qwen 4x7 vs 28x1), side by side."""

from __future__ import annotations

import argparse

from .harness import Case, ModelFlops, Row, Setup, measure, release, speed_ratios
from .models import FAMILIES, build, full_step, model_config, train_step
from .synthetic import random_tokens


def bench_loop_vs_nonloop(setup: Setup, families: list[str]) -> list[Row]:
    """Equal effective depth, equal FLOPs: the loop's only extra cost is re-entering the shared
    blocks. ``model`` steps are forward + backward (the FLOPs-equal comparison the target is
    about); ``full`` steps add Muon+AdamW, which is cheaper for the loop (fewer matrices)."""
    rows = []
    for family in families:
        _, _, loop, nonloop = FAMILIES[family]
        cases, info = {}, {}
        for core, loops in (loop, nonloop):
            cfg = model_config(setup, family, core, loops)
            model = build(cfg, setup)
            tokens = random_tokens(cfg, setup)
            flops = ModelFlops(cfg, setup.seq)
            name = f"{family} {core}x{loops}"
            info[name] = {"effective_depth": cfg.effective_depth(), "params_m": model.num_parameters() / 1e6}
            cases[f"{name} model"] = Case(train_step(model, None, tokens), tokens.numel(), flops, check_syncs=True)
            cases[f"{name} full"] = Case(full_step(model, cfg, setup, tokens), tokens.numel(), flops)
        measured = measure(cases, setup)
        for name, metrics in measured.items():
            rows.append(Row("loop-vs-nonloop", name, info[name.rsplit(" ", 1)[0]], metrics))
        a, b = info
        for kind in ("model", "full"):
            ratios = speed_ratios(measured[f"{a} {kind}"], measured[f"{b} {kind}"])
            rows.append(Row("loop-vs-nonloop", f"ratio {a} / {b} ({kind})", {},
                            {**ratios, "target": ">= 0.97" if kind == "model" else "-"}))
        del cases
        release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_loop_vs_nonloop(setup, args.families)
