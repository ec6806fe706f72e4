"""Synthetic ``items.json`` of the paired loop study (``eval/paired.py``'s format) with planted
changes, for the statistics and report tests (``eval/paired_stats.py``, ``eval/paired_report.py``)."""

from __future__ import annotations

import numpy as np


def paired_items(seed: int, k: int, delta_r: float, delta_k: float, base_r: float = 0.55, base_k: float = 0.6,
           n_r: int = 600, n_k: int = 300, hops: int = 6) -> dict:
    """A synthetic items.json of a BaseLoop with K = k: outcomes at every r = 1..2K, where r >= K + 1
    moves a share of the items (gains and losses) so that the change from K is ``delta`` on average,
    r < K loses 20 points of both."""
    rng = np.random.default_rng(seed)

    def task(n: int, base: float, delta: float) -> dict:
        at_k = (rng.random(n) < base).astype(int)
        correct = {}
        for r in range(1, 2 * k + 1):
            c = at_k.copy()
            if r < k:
                lose = rng.random(n) < 0.2 / base
                c[lose] = 0
            elif r > k:
                frac = delta * (r - k) / k  # linear in r up to delta at 2K
                # noise with no mean change: 10 % of the right items go wrong, as many wrong ones right
                u = rng.random(n)
                c[(at_k == 1) & (u < 0.1)] = 0
                c[(at_k == 0) & (u < 0.1 * base / (1 - base))] = 1
                move = rng.random(n) < abs(frac) / (1 - base if frac > 0 else base)
                c[move & ((at_k == 0) if frac > 0 else (at_k == 1))] = 1 if frac > 0 else 0
            correct[str(r)] = "".join(map(str, c))
        return {"correct": correct, "n": n}

    loops = list(range(1, 2 * k + 1))
    compose = task(n_r, base_r, delta_r)
    compose.update(metric="acc", group="reasoning", chance=10.0, depth=[1 + i % hops for i in range(n_r)],
                   trained_depths=[1, 2, 3, 4])
    facts = task(n_k, base_k, delta_k)
    facts.update(metric="acc_norm", group="knowledge", chance=25.0, depth=None, trained_depths=[])
    return {"layout": f"0+1x{k}+0", "train_loops": k, "loops": loops,
            "effective_depth": {str(r): r for r in loops}, "tasks": {"compose": compose, "facts": facts},
            "heldout": {str(r): {"loss": 1.0 + abs(r - k) / 10} for r in loops}}
