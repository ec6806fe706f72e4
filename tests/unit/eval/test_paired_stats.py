"""``megatron_loop/eval/paired_stats.py``: the paired item-level changes and their hierarchical
bootstrap (seeds, then items) recover a planted change and cover 0 without one; the pre-registered
exclusion and decision rules; a study cut short is analysed from the runs that finished."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from megatron_loop import registry
from megatron_loop.errors import LoopDataError
from megatron_loop.eval import paired_stats
from megatron_loop.registry.paired import PairedPlan
from paired_fixtures import paired_items

PLAN = PairedPlan(primary="loop", fixed="test", bootstrap_replicates=4000, curve_replicates=300)


def test_hierarchical_bootstrap_recovers_a_planted_change_and_covers_zero_without_one():
    """Five seeds with Delta_R = +8 and Delta_K = -10 points planted at r = 2K: the point estimates are
    the paired item-level means, the intervals exclude 0 on the right side and the rule says supported;
    with nothing planted the intervals cover 0 and the rule says not supported; a seed at the
    knowledge ceiling is excluded before any change is read; the bootstrap's spread matches the
    binomial standard error of the seed mean."""
    started = time.time()
    planted = {s: paired_items(s, 4, 0.08, -0.10) for s in range(1, 6)}
    m = paired_stats.analyse_model(planted, PLAN)
    per_seed = [m["runs"][str(s)]["target"] for s in range(1, 6)]
    assert m["primary"]["R"]["mean"] == pytest.approx(np.mean([r["R"] for r in per_seed]))
    assert m["primary"]["R"]["mean"] == pytest.approx(8.0, abs=2.5)
    assert m["primary"]["K"]["mean"] == pytest.approx(-10.0, abs=2.5)
    assert m["primary"]["D"]["mean"] == pytest.approx(m["primary"]["R"]["mean"] - m["primary"]["K"]["mean"])
    assert m["primary"]["R"]["lower_one_sided"] > 0 > m["primary"]["K"]["upper_one_sided"]
    assert m["primary"]["R"]["lo95"] < m["primary"]["R"]["lower_one_sided"] < m["primary"]["R"]["mean"]
    assert m["verdict"] == "supported" and m["seeds_included"] == [1, 2, 3, 4, 5]
    # the control r = K - 1 falls by the planted 20 points for both
    assert m["control"]["R"]["mean"] == pytest.approx(-20.0, abs=3) and m["control"]["K"]["hi95"] < 0
    assert m["curves"][m["loops"].index(4)]["R"]["mean"] == 0.0  # r = K against itself
    assert set(m["per_hop_target"]) == {"1", "2", "3", "4", "5", "6"}

    null = {s: paired_items(10 + s, 4, 0.0, 0.0) for s in range(1, 6)}
    n = paired_stats.analyse_model(null, PLAN)
    for key in ("R", "K", "D"):
        assert n["primary"][key]["lo95"] < 0 < n["primary"][key]["hi95"], key
    assert n["verdict"] == "not supported"

    # one seed: the interval is the item-level one, close to the binomial standard error of the change
    one = {1: paired_items(21, 4, 0.0, 0.0)}
    o = paired_stats.analyse_model(one, PLAN)
    d = paired_stats.outcomes(one[1], "compose", 8).astype(int) - paired_stats.outcomes(one[1], "compose", 4)
    se = 100 * d.std(ddof=1) / np.sqrt(len(d))
    width = o["primary"]["R"]["hi95"] - o["primary"]["R"]["lo95"]
    assert width == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert o["verdict"] == "inconclusive"  # fewer than min_seeds

    ceiling = dict(planted)
    ceiling[3] = paired_items(3, 4, 0.08, -0.10, base_k=0.99)
    c = paired_stats.analyse_model(ceiling, PLAN)
    assert c["seeds_included"] == [1, 2, 4, 5] and not c["runs"]["3"]["included"]
    assert "knowledge at r = K" in c["runs"]["3"]["excluded_because"][0]
    assert c["primary"]["seeds"] == 4
    assert time.time() - started < 20


def test_exclusion_reads_r_equals_k_only_and_a_study_cut_short_is_analysed_from_what_finished(tmp_path):
    """The plan's exclusion rule: a reasoning task not learned (trained hops below the floor) or at the
    ceiling over every hop, or knowledge outside its band, excludes the run, whatever its changes; a
    study cut short (``available_only``) is analysed from the items.json that exist, in the study's model
    order, listing the others as not run, and without ``available_only`` a missing run is an error."""
    assert paired_stats.exclusion_reasons(paired_items(1, 4, 0.3, -0.3), PLAN, 4) == []
    floor = paired_stats.exclusion_reasons(paired_items(2, 4, 0.0, 0.0, base_r=0.2), PLAN, 4)
    assert len(floor) == 1 and floor[0].startswith("reasoning (trained hops) at r = K") and "below 35" in floor[0]
    ceiling = paired_stats.exclusion_reasons(paired_items(3, 4, 0.0, 0.0, base_r=0.99, base_k=0.2), PLAN, 4)
    assert [c.split(" at r = K")[0] for c in ceiling] == ["knowledge", "reasoning (every hop)"]
    post_hoc = PLAN.post_hoc_all_runs()  # the exploratory reading: the same statistics, nothing excluded
    assert post_hoc.post_hoc and not PLAN.post_hoc
    assert paired_stats.exclusion_reasons(paired_items(3, 4, 0.0, 0.0, base_r=0.99, base_k=0.2), post_hoc, 4) == []
    assert paired_stats.exclusion_reasons(paired_items(2, 4, 0.0, 0.0, base_r=0.2), post_hoc, 4) == []

    study = registry.STUDIES["finding1_paired"]
    import dataclasses

    quick = dataclasses.replace(study, paired=dataclasses.replace(study.paired, bootstrap_replicates=300,
                                                                  curve_replicates=50))
    for name, k, seed in (("baseloop_2x4", 4, 1), ("baseloop_2x4", 4, 2), ("baseloop_2x4", 4, 3),
                          ("baseloop_1x8", 8, 1)):
        folder = tmp_path / f"{name}-seed{seed}" / "paired"
        folder.mkdir(parents=True)
        (folder / "items.json").write_text(json.dumps(paired_items(seed, k, 0.05, -0.05)))
    with pytest.raises(LoopDataError, match="baseloop_2x4-seed4/paired/items.json: missing"):
        paired_stats.analyse(quick, tmp_path)
    summary = paired_stats.analyse(quick, tmp_path, available_only=True)
    assert list(summary["models"]) == ["baseloop_1x8", "baseloop_2x4"]  # the study's order
    assert summary["models"]["baseloop_2x4"]["seeds_included"] == [1, 2, 3]
    assert summary["not_run"][:2] == ["baseloop_2x4-seed4", "baseloop_2x4-seed5"] and len(summary["not_run"]) == 11
    assert summary["verdict"] == summary["models"]["baseloop_2x4"]["verdict"] != "inconclusive"
    only = paired_stats.analyse(quick, tmp_path, models=["baseloop_2x4"], seeds=[1, 2])
    assert list(only["models"]) == ["baseloop_2x4"] and only["not_run"] == [] and only["verdict"] == "inconclusive"
