"""``megatron_loop/plan.py``: a run's token budget and steps from the config (App. C.2). (The parameter
count against the built model and the ``--dry-run`` report: test_dryrun.py.)"""

from __future__ import annotations

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.plan import training_plan

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


def test_default_token_budget_is_twenty_tokens_per_nonloop_parameter():
    cfg = config_from_dict({"model": {"backbone": "llama3.1-1b", "core_layers": 4, "train_loops": 5},
                            "train": {"global_batch_size": 1824, "micro_batch_size": 38, "seq_length": 2048}})
    plan = training_plan(cfg)
    assert plan["train_tokens"] == 20 * 1_007_482_368
    assert plan["train_steps"] == 5394
