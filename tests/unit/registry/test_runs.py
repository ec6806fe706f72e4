"""``registry/runs.py``: every model the paper trains, counted per part of the paper, each at its family's
training depth L(K) (the configs rendered from them: tests/unit/registry/test_registry.py)."""

from __future__ import annotations

from collections import Counter

from megatron_loop.registry.recipes import FAMILIES
from megatron_loop.registry.runs import CORELOOPS, QWEN_4X7, RUNS, family_runs, paper_runs, qwen_4x7_ablation_runs


def test_family_runs_counts():
    # NonLoop + 4 BaseLoops + the CoreLoops + 4 initial-state injections and 3 timestep conditionings per BaseLoop
    assert len(CORELOOPS["llama"]) == 14 and len(CORELOOPS["qwen"]) == 3
    assert len(family_runs("llama")) == 1 + 4 + 14 + 4 * 4 + 4 * 3 == 47
    assert len(family_runs("qwen")) == 1 + 4 + 3 + 4 * 4 + 4 * 3 == 36
    assert Counter(r.kind for r in family_runs("qwen")) == {"NonLoop": 1, "BaseLoop": 4 + 28, "CoreLoop": 3}


def test_every_family_run_trains_at_the_family_depth():
    for family in ("llama", "qwen"):
        depth = FAMILIES[family].effective_depth
        assert {r.effective_depth for r in family_runs(family)} == {depth}
    assert (FAMILIES["llama"].effective_depth, FAMILIES["qwen"].effective_depth) == (20, 28)


def test_the_qwen_4x7_ablations():
    runs = qwen_4x7_ablation_runs()
    # history 3x3, initial+history 3x3, initial+timestep 2x2, history+timestep 2x3 + 2x2, all three 2x2, noise 3
    assert len(runs) == 9 + 9 + 4 + 6 + 4 + 4 + 3 == 39
    assert {(r.prelude, r.core, r.loops, r.coda) for r in runs} == {QWEN_4X7} == {(0, 4, 7, 0)}
    noted = [r.conditioning for r in runs if "Fig. 17" in r.note]  # the caption's dense reading, registered too
    assert sorted((c.initial, c.history, c.timestep) for c in noted) == [("dense", "none", "branch_gating"),
                                                                        ("dense", "none", "loop_gating")]


def test_names_are_unique_and_the_table_is_the_paper_runs():
    names = [r.name for r in paper_runs()]
    assert len(names) == len(set(names)) == len(RUNS)
    assert list(RUNS) == names
