"""The registered plans applied to per-item results (megatron_loop/studies/analysis.py): budgets resolved per
layout, per-seed changes computed by hand, the decision rule's three outcomes on planted effects."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_loop.studies import PLANS
from megatron_loop.studies import analysis as A
from megatron_loop.studies.plan import Change, Measure, Test, resolve_budget
from study_fixtures import synthetic_run, synthetic_study


def test_budgets():
    assert [resolve_budget(b, (0, 2, 4, 0)) for b in ("K", "2K", "K-1", "half_depth", "double_depth")] == [4, 8, 3, 2, 8]
    assert [resolve_budget(b, (0, 1, 7, 1)) for b in ("half_depth", "double_depth")] == [3, 15]
    assert [resolve_budget(b, (1, 1, 7, 0)) for b in ("half_depth", "double_depth")] == [3, 15]
    with pytest.raises(ValueError, match="no loop count"):
        resolve_budget("half_depth", (0, 2, 3, 0))  # L(K) = 6: L(r) = 3 needs r = 1.5


def test_per_seed_changes_by_hand():
    plan = PLANS["finding1_r2"]
    run = synthetic_run((0, 2, 4, 0), 1, reasoning_gain=0.2, knowledge_fall=0.3)
    runs = {"baseloop_2x4": {1: run}}
    split = np.array(run["tasks"]["compose"]["split"]) == "in_horizon"
    at = lambda r: np.array(list(run["tasks"]["compose"]["correct"][str(r)]), dtype=int)  # noqa: E731
    want = 100.0 * (at(8)[split].mean() - at(4)[split].mean())
    got = A.change_per_seed(plan, runs, Change(Measure("compose", "accuracy", split="in_horizon"), "baseloop_2x4"))
    assert got[1] == pytest.approx(want)
    m = lambda r: np.array(run["tasks"]["facts"]["margin"][str(r)]) / 1000.0  # noqa: E731
    got = A.change_per_seed(plan, runs, Change(Measure("facts", "margin"), "baseloop_2x4"))
    assert got[1] == pytest.approx(m(8).mean() - m(4).mean()) and got[1] == pytest.approx(-0.3, abs=1e-3)
    # a contrast of two measures of one run, and of two models at the same seed
    spec = Change(Measure("facts", "margin"), "baseloop_2x4", minus=Change(Measure("openbook", "margin"), "baseloop_2x4"))
    assert A.change_per_seed(plan, runs, spec)[1] == pytest.approx(-0.3, abs=1e-3)


def test_decision_rule():
    up, down = Test("u", None, +1, 2.0, ""), Test("d", None, -1, 0.1, "")
    stat = lambda lower, upper: {"lower": lower, "upper": upper}  # noqa: E731
    assert A.decide(up, stat(0.5, 4.0)) == A.SUPPORTED
    assert A.decide(up, stat(-1.0, 1.9)) == A.NOT_SUPPORTED  # a rise of 2 points ruled out
    assert A.decide(up, stat(-1.0, 2.5)) == A.INCONCLUSIVE
    assert A.decide(down, stat(-0.5, -0.01)) == A.SUPPORTED
    assert A.decide(down, stat(-0.09, 0.2)) == A.NOT_SUPPORTED
    assert A.decide(down, stat(-0.3, 0.2)) == A.INCONCLUSIVE and A.decide(up, None) == A.INCONCLUSIVE
    assert A.combine([A.SUPPORTED, A.SUPPORTED]) == A.SUPPORTED
    assert A.combine([A.SUPPORTED, A.INCONCLUSIVE]) == A.INCONCLUSIVE
    assert A.combine([A.INCONCLUSIVE, A.NOT_SUPPORTED]) == A.NOT_SUPPORTED


@pytest.mark.parametrize("effects, verdict", [
    (dict(reasoning_gain=0.3, knowledge_fall=0.3, noise=0.02), A.SUPPORTED),
    (dict(reasoning_gain=0.0, knowledge_fall=0.3, noise=0.005), A.NOT_SUPPORTED),
    (dict(reasoning_gain=-0.2, knowledge_fall=0.3, noise=0.02), A.NOT_SUPPORTED),
])
def test_finding1_verdicts_on_planted_effects(effects, verdict):
    plan = PLANS["finding1_r2"]
    summary = A.analyse(plan, synthetic_study(plan, **effects))
    assert summary["verdict"] == verdict, summary["primary"]
    assert not summary["missing_runs"] and summary["plan_sha256"] == plan.sha256()
    assert all(s["stat"] is not None for s in summary["secondary"])


def test_a_study_with_two_seeds_of_noise_is_inconclusive():
    plan = PLANS["finding1_r2"]
    runs = synthetic_study(plan, reasoning_gain=0.0, knowledge_fall=0.3, noise=0.3)
    runs = {"baseloop_2x4": {s: runs["baseloop_2x4"][s] for s in (1, 2)}}
    summary = A.analyse(plan, runs)
    assert summary["verdict"] == A.INCONCLUSIVE and len(summary["missing_runs"]) == len(plan.arms[0].seeds) - 2


def test_contrast_studies_run_on_every_plan():
    """finding2 and finding3's contrasts pair models by seed; identical models give a contrast of exactly 0."""
    for name in ("finding2", "finding3"):
        plan = PLANS[name]
        runs = synthetic_study(plan, knowledge_fall=0.3)
        same = {arm.name: {s: synthetic_run(arm.toy.layout, s, knowledge_fall=0.3) for s in arm.seeds}
                for arm in plan.arms}
        for part in A.analyse(plan, same)["primary"]:
            if plan.name == "finding3":  # same layout: the same synthetic run, a contrast of exactly 0
                assert part["stat"]["mean"] == pytest.approx(0.0, abs=1e-9)
        assert A.analyse(plan, runs)["verdict"] in (A.SUPPORTED, A.NOT_SUPPORTED, A.INCONCLUSIVE)
