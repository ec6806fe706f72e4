"""Loop sweeps at matched effective depth (Sec. 2.2 (iii)): which inference loop counts r each
run is evaluated and probed at, so that every comparison meets at the same depths D."""

from __future__ import annotations

from megatron_loop.registry.architectures import Layout
from megatron_loop.registry.runs import RUNS
from megatron_loop.registry.studies import STUDY_LIST


def matched_depths(layout: Layout, depth_multiple: int) -> list[int]:
    """The effective depths a study compares its models at (Sec. 2.2 (iii): inference depth is
    matched in every comparison): the training depth L(K) and its multiples up to m·L(K)
    (D = 20, 40 for Llama; 28, 56 and, in Sec. 6 / App. D.6, 84 for Qwen). NonLoop: L only."""
    p, s, k, c = layout
    base = p + k * s + c
    return [base] if k == 1 else [j * base for j in range(1, depth_multiple + 1)]


def loops_for_depth(layout: Layout, depth: int) -> int:
    """The first r whose L(r) = p + r·s + c reaches ``depth``: r = ceil((D - p - c) / s) (>= 1).
    L(r) equals D whenever s divides D - p - c (every CoreLoop but the 3-layer cores at D = 40,
    where it is D + 1)."""
    p, s, _, c = layout
    return max(1, -(-(depth - p - c) // s))


def sweep_loops(layout: Layout, depth_multiple: int) -> list[int]:
    """Inference loop counts r = 1 .. the r that reaches m·L(K) (NonLoop: r = 1). For a BaseLoop
    that is m·K; a CoreLoop needs more (0+2x9+2 at D = 40: r = 19, not 2K = 18)."""
    if layout[2] == 1:
        return [1]
    return list(range(1, loops_for_depth(layout, matched_depths(layout, depth_multiple)[-1]) + 1))


def probe_loops(layout: Layout, depth_multiple: int) -> list[int]:
    """r for the geometry probes (App. C.4 compares under-unrolling, K, extrapolation): 1, K/2 and
    the r reaching each matched depth (K, then e.g. 19 for 0+2x9+2 at D = 40, Fig. 8(a))."""
    k = layout[2]
    return sorted({1, max(1, k // 2)} | {loops_for_depth(layout, d) for d in matched_depths(layout, depth_multiple)})


def sweep_summary(layout: Layout, depth_multiple: int) -> str:
    """``r 1-19 (D 20 @ r 9, 40 @ r 19)``: the sweep and the r at each matched depth (its L(r) when
    it overshoots), as --list-configs and docs/REPRODUCE.md show it."""
    p, s, _, c = layout
    loops = sweep_loops(layout, depth_multiple)
    hits = []
    for d in matched_depths(layout, depth_multiple):
        r = loops_for_depth(layout, d)
        reached = p + r * s + c
        hits.append(f"{d} @ r {r}" + (f" (L = {reached})" if reached != d else ""))
    span = "r 1" if len(loops) == 1 else f"r 1-{loops[-1]}"
    return f"{span} (D {', '.join(hits)})"


def run_depth_multiple(name: str) -> int:
    """The largest depth multiple among the studies that evaluate ``name`` (2 when none)."""
    family = RUNS[name].family
    return max((s.multiple_for(family) for s in STUDY_LIST if name in s.runs and not s.params_only), default=2)
