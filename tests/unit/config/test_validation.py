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


@pytest.mark.parametrize("sections,message", [
    # values whose typo would otherwise run (or hang, or overflow) instead of stopping at load
    ({"model": {"train_loops": 99999999999999999999999}},
     "model.train_loops=99999999999999999999999: expected at most 1024"),
    ({"train": {"eval_loops": [3, 3, 1]}}, "train.eval_loops=[3, 3, 1]: expected distinct loop counts in increasing "
                                          "order, e.g. [1, 3]"),
    ({"train": {"eval_loops": [100000]}}, "train.eval_loops=[100000]: expected loop counts of at most 1024"),
    ({"train": {"loop_sampling": "uniform", "loop_sampling_max": 5000}},
     "train.loop_sampling_max=5000: expected null or at most 1024"),
    ({"model": {"initializer_range": 1e10}}, "model.initializer_range=10000000000.0: expected a float in (0, 1]"),
    ({"model": {"backbone": "tiny-llama", "rope_scaling": {"factor": 0}}},
     "model.rope_scaling.factor=0: expected a number >= 1"),
    ({"model": {"backbone": "tiny-llama", "rope_scaling": {"high_freq_factor": 0.5}}},
     "model.rope_scaling.high_freq_factor=0.5: expected a number > low_freq_factor=1.0"),
    ({"model": {"backbone": "tiny-llama", "rope_scaling": {"original_max_position_embeddings": "big"}}},
     "model.rope_scaling.original_max_position_embeddings='big': expected a positive integer"),
    ({"train": {"collective_timeout_s": 1e308}}, "train.collective_timeout_s=1e+308: expected at most 604,800 seconds"),
    ({"data": {"worker_timeout_s": 1e308}}, "data.worker_timeout_s=1e+308: expected at most 604,800 seconds"),
    ({"train": {"seed": -1}}, "train.seed=-1: expected an integer in [0, 2^32 - 1 = 4294967295]"),
    ({"train": {"seed": 2**64 + 1}}, "train.seed=18446744073709551617: expected an integer in [0, 2^32 - 1"),
    ({"model": {"train_loops": 3, "history_injection": "channel", "history_window": 50}},
     "model.history_window=50: expected at most the largest training loop count 3 (model.train_loops=3)"),
    ({"data": {"train_prefixes": ["d/a", "d/b", "d/./a"]}},
     "data.train_prefixes[2]='d/./a': listed twice; expected each prefix once"),
    ({"data": {"train_prefixes": ["d/a"], "valid_prefixes": ["d/b", "d/a"]}},
     "data.valid_prefixes[1]='d/a': also a train prefix; expected held-out data"),
])
def test_absurd_and_contradictory_values_are_one_error(sections, message):
    with pytest.raises(LoopConfigError) as err:
        config_from_dict(sections, source="bad.yaml")
    assert str(err.value).startswith(f"bad.yaml: {message}"), str(err.value)


def test_history_window_follows_the_largest_loop_count_a_step_draws():
    """w up to the largest training loop count: K when fixed, loop_sampling_max when sampled."""
    base = {"train_loops": 3, "history_injection": "scalar"}
    assert config_from_dict({"model": {**base, "history_window": 3}}).model.history_window == 3
    sampled = {"loop_sampling": "uniform", "loop_sampling_max": 5}
    assert config_from_dict({"model": {**base, "history_window": 5}, "train": sampled}).model.history_window == 5


def test_a_validation_prefix_that_is_a_train_prefix_under_another_spelling_is_refused(tmp_path, monkeypatch):
    """Once the paths are resolved (relative -> absolute, symlinks followed) two spellings of one file
    are one prefix."""
    from megatron_loop import load_config

    (tmp_path / "d").mkdir()
    for ext in (".bin", ".idx"):
        (tmp_path / "d" / f"a{ext}").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  train_prefixes: [d/a]\n  valid_prefixes: [{tmp_path}/link/a]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoopConfigError) as err:
        load_config(config)
    assert str(err.value) == (f"{config}: data.valid_prefixes[0]='{tmp_path}/link/a': also a train prefix; expected "
                              "held-out data (tools/preprocess_data.py --validation-documents writes P_valid)")
