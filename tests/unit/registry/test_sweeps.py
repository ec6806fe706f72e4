"""``registry/sweeps.py``: the loop counts of each sweep at matched effective depth (Sec. 2.2 (iii)), exact
values for the paper's layouts (the listing that prints them: tests/unit/registry/test_registry.py)."""

from __future__ import annotations

from megatron_loop.registry.sweeps import (loops_for_depth, matched_depths, probe_loops, sweep_loops,
                                           sweep_summary)

CORE_9 = (0, 2, 9, 2)  # 0+2x9+2: L(K) = 20
CORE_3 = (1, 3, 6, 1)  # 3-layer core: s does not divide D - p - c at D = 40
BASE = (0, 5, 4, 0)  # BaseLoop 5x4: L(K) = 20
NON_LOOP = (0, 20, 1, 0)


def test_matched_depths_are_multiples_of_the_training_depth():
    assert matched_depths(CORE_9, 2) == [20, 40]
    assert matched_depths((0, 4, 7, 0), 3) == [28, 56, 84]  # Qwen 4x7 in Sec. 6 / App. D.6
    assert matched_depths(NON_LOOP, 3) == [20]


def test_loops_for_depth_is_the_first_r_reaching_it():
    assert loops_for_depth(CORE_9, 20) == 9 and loops_for_depth(CORE_9, 40) == 19
    assert loops_for_depth(CORE_3, 40) == 13  # L(13) = 41: the first r at or beyond 40
    assert loops_for_depth(CORE_9, 1) == 1  # never below one loop


def test_sweeps_and_probes():
    assert sweep_loops(BASE, 2) == list(range(1, 9))  # m·K for a BaseLoop
    assert sweep_loops(CORE_9, 2) == list(range(1, 20))  # 19, not 2K = 18
    assert sweep_loops(NON_LOOP, 2) == [1]
    assert probe_loops(CORE_9, 2) == [1, 4, 9, 19]  # 1, K/2, and the r of each matched depth
    assert probe_loops(BASE, 2) == [1, 2, 4, 8]


def test_summary_text():
    assert sweep_summary(CORE_9, 2) == "r 1-19 (D 20 @ r 9, 40 @ r 19)"
    assert sweep_summary(CORE_3, 2) == "r 1-13 (D 20 @ r 6, 40 @ r 13 (L = 41))"
    assert sweep_summary(NON_LOOP, 2) == "r 1 (D 20 @ r 1)"

