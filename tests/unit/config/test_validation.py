"""``config/validation.py``: each bad value is one error naming the file, the key and what is expected;
``train.eval_loops`` defaults to K/2, K, 2K (the prefix grid stops at K). (``train.loop_sampling``'s
checks: tests/unit/training/test_loop_sampling.py; through the CLI: tests/integration/cli/test_config_checks.py.)"""

from __future__ import annotations

import pytest

from megatron_loop import LoopConfigError
from megatron_loop.config import config_from_dict

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


@pytest.mark.parametrize("model,train,message", [
    ({"core_layers": 2, "bogus": 1}, {}, "model.bogus: unknown key"),
    ({"prelude_layers": -1}, {}, "model.prelude_layers=-1: expected an integer >= 0"),
    ({"coda_layers": -2}, {}, "model.coda_layers=-2: expected an integer >= 0"),
    ({"train_loops": 0}, {}, "model.train_loops=0: expected an integer >= 1"),
    ({"num_attention_heads": 6, "num_key_value_heads": 4}, {}, "model.num_attention_heads=6: expected a multiple of num_key_value_heads=4"),
    ({"backbone": "gpt5"}, {}, "model.backbone='gpt5': unknown backbone"),
    ({"backbone": "tiny-llama"}, {"seq_length": 8192}, "train.seq_length=8192: expected at most the model's maximum context"),
    ({"core_layers": "four"}, {}, "model.core_layers='four': expected an integer"),
    ({"timestep": "fourier"}, {}, "model.timestep='fourier': expected one of"),
    ({}, {"global_batch_size": 10, "micro_batch_size": 4}, "train.global_batch_size=10: expected a multiple of micro_batch_size=4"),
])
def test_bad_config_errors(model, train, message):
    with pytest.raises(LoopConfigError) as err:
        config_from_dict({"model": model, "train": train}, source="bad.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("bad.yaml: ")


def test_default_validation_loops():
    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4}})
    assert cfg.train.eval_loops == [2, 4, 8]  # K/2, K, 2K
    prefix = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4, "timestep": "adaln",
                                         "timestep_grid": "prefix"}})
    assert prefix.train.eval_loops == [2, 4]
