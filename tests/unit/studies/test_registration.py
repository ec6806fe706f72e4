"""``studies/registration.py``: each registered hash is the sha256 of its study's plan text as the code holds
it now (a plan edited after registration would make ``tools/study.py gate`` refuse every run; the commit of
each registration: tests/unit/studies/test_reanalysis.py and test_provenance.py)."""

from __future__ import annotations

import re

from megatron_loop.studies import PLANS
from megatron_loop.studies.registration import REGISTERED


def test_every_registered_study_is_a_plan_with_that_hash():
    assert REGISTERED, "no registered study"
    for name, digest in REGISTERED.items():
        assert re.fullmatch(r"[0-9a-f]{64}", digest), name
        assert name in PLANS, name
        assert PLANS[name].sha256() == digest, f"{name}: the plan text changed after its registration"
