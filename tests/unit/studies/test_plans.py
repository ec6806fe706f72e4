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
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_text_is_pinned(name):
    assert PLANS[name].sha256() == PINNED[name] == REGISTERED[name]


def test_every_registered_study_has_a_plan():
    assert set(REGISTERED) == set(PINNED) == set(PLANS)


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
