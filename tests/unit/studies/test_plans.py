"""The registered plans (megatron_loop/studies/plans.py): each plan's text is pinned by its sha256 here and in
studies/registration.py (an edited plan fails here; a changed plan is a new study under a new name); the
seed counts are what the power analysis written into each plan gives; every model of a study is a CPU twin
whose config the registry writes (matched L(K) and parameter counts where the plan says so)."""

from __future__ import annotations

import pytest

from megatron_loop.config import load_config
from megatron_loop.plan import count_parameters
from megatron_loop.registry import toy_config
from megatron_loop.studies import PLANS, REGISTERED, registry_study
from megatron_loop.studies.plan import resolve_budget

PINNED = {
    "finding1_r2": "ac3b48d7752c7c41e36653f3abab297aed0e172c521bf9550e3285183621e556",
    "finding2": "83ffa23dd5d2b12138627725b570d81ad200dcf799865dc9253bad0f84a88873",
    "finding3": "0c8afafdc3907d9df373c520756f243be0fd06dda0d96ed5ffb0c63f67fd3037",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_plan_text_is_pinned(name):
    assert PLANS[name].sha256() == PINNED[name] == REGISTERED[name]


def test_every_registered_study_is_pinned_and_every_draft_unrun():
    """A plan not yet registered is a draft: it has no archive (nothing may run before its registration)."""
    from megatron_loop.studies import archive
    from testpaths import REPO

    assert set(REGISTERED) == set(PINNED) <= set(PLANS)
    for name in set(PLANS) - set(REGISTERED):
        assert not archive.archive_path(REPO, name).exists()


def test_power_analysis_of_finding1():
    """The seed counts written into finding1_r2's plan are what the power analysis gives on the pilots."""
    import numpy as np

    from megatron_loop.studies.plans import PILOT_F1
    from megatron_loop.studies.stats import power, seeds_for_power

    plan = PLANS["finding1_r2"]
    sesoi = {t.name: t.sesoi for t in plan.primary}
    sd = {k: round(float(np.std(v, ddof=1)), 2) for k, v in PILOT_F1.items()}
    assert sd == {"R": 4.93, "K": 0.78}
    assert seeds_for_power(sd["R"], sesoi["R"]) == 19 and seeds_for_power(sd["K"], sesoi["K"]) == 17
    assert round(power(20, sd["R"], sesoi["R"]), 2) == 0.84 and round(power(20, sd["K"], sesoi["K"]), 2) == 0.87
    assert len(plan.arms[0].seeds) == 20
    assert "19 seeds give 80 % power, 20 give 0.84" in plan.text() and "17 seeds give 80 % power, 20 give 0.87" in plan.text()


@pytest.mark.parametrize("name", sorted(PLANS))
def test_models_and_budgets(name, tmp_path):
    import yaml

    plan = PLANS[name]
    study = registry_study(plan)
    depths, params = set(), {}
    for arm in plan.arms:
        config_text = yaml.safe_dump(toy_config(arm.toy, str(tmp_path), dict(plan.train)))
        (tmp_path / f"{arm.name}.yaml").write_text(config_text)
        model = load_config(str(tmp_path / f"{arm.name}.yaml")).model
        p, s, k, c = arm.toy.layout
        assert (model.prelude_layers, model.core_layers, model.train_loops, model.coda_layers) == (p, s, k, c)
        depths.add(p + k * s + c)
        params[arm.name] = count_parameters(model).total
        for test in plan.primary:
            for change in (test.change, test.change.minus):
                if change is not None and change.arm == arm.name:
                    assert resolve_budget(change.ref, arm.toy.layout) != resolve_budget(change.at, arm.toy.layout)
    assert depths == {8}  # every model at L(K) = 8
    if name == "finding2":  # BaseLoop and CoreLoops: two blocks each, the same parameters
        assert len(set(params.values())) == 1, params
    assert study.seeds == plan.arms[0].seeds and len(study.toys()) == len(plan.arms)


def test_power_analysis_of_finding2():
    """finding2's seed count: the contrast's planning spread sqrt(2) x the BaseLoop pilots' spread."""
    import numpy as np

    from megatron_loop.studies.plans import PILOT_F2
    from megatron_loop.studies.stats import power, seeds_for_power

    plan = PLANS["finding2"]
    sd = round(float(np.std(PILOT_F2["base_half"], ddof=1)) * np.sqrt(2), 2)
    (test,) = plan.primary
    assert sd == 0.35 and seeds_for_power(sd, test.sesoi) == 10
    assert round(power(10, sd, test.sesoi), 2) == 0.80 and round(power(8, sd, test.sesoi), 2) == 0.70
    assert [len(arm.seeds) for arm in plan.arms] == [10, 10, 4]
    assert "10 seeds give 80 % power (0.80), 8 give 0.70" in plan.text()


def test_power_analysis_of_finding3():
    """finding3's seed count: each contrast's planning spread sqrt(2) x the plain BaseLoop pilots' spread."""
    import numpy as np

    from megatron_loop.studies.plans import PILOT_F3
    from megatron_loop.studies.stats import power, seeds_for_power

    plan = PLANS["finding3"]
    sd = round(float(np.std(PILOT_F3["base_2k"], ddof=1)) * np.sqrt(2), 2)
    assert sd == 1.10 and {t.sesoi for t in plan.primary} == {1.1}
    assert seeds_for_power(sd, 1.1) == 8 and round(power(8, sd, 1.1), 2) == 0.81
    assert seeds_for_power(sd, 1.0) == 10 and seeds_for_power(sd, 0.75) == 15
    assert [len(arm.seeds) for arm in plan.arms] == [8, 8, 8]
