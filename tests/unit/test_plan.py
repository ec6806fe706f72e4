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


def test_a_plan_the_host_cannot_hold_is_refused_before_it_is_built():
    """The data index (32 bytes per sample) and the fp32 parameters (4 bytes each, over the TP ranks)
    against the host's memory: exactly at the limit passes, one byte short fails, naming the keys."""
    from megatron_loop.errors import LoopConfigError
    from megatron_loop.plan import INDEX_BYTES_PER_SAMPLE, PARAMETER_BYTES, check_fits_host, count_parameters

    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "vocab_size": 640},
                            "train": {"max_steps": 1000, "global_batch_size": 8, "micro_batch_size": 2}})
    index = 1000 * 8 * INDEX_BYTES_PER_SAMPLE
    params = count_parameters(cfg.model).total * PARAMETER_BYTES
    check_fits_host(cfg, 1000, memory=max(index, params))
    with pytest.raises(LoopConfigError, match=r"^train\.max_steps=1000 x train\.global_batch_size=8 = 8,000 samples: "
                                              r"the data plan's index needs about 0 GiB \(32 bytes per sample\)"):
        check_fits_host(cfg, 1000, memory=index - 1)
    with pytest.raises(LoopConfigError, match=r"^model\.vocab_size=640, hidden_size=64, 4 blocks: [\d,]+ parameters "
                                              r"\([\d,]+ per tensor-parallel rank\) need 0 GiB in fp32"):
        check_fits_host(cfg, 1, memory=params - 1)
