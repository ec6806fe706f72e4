"""Values checked when the config is loaded, not inside the first step: optimizer and budget
values out of range and contradictory settings stop ``pretrain_loop.py`` (and its ``--dry-run``)
with one ``error:`` line naming the key, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megatron_loop.config import load_config
from megatron_loop.errors import LoopConfigError
from train_fixtures import env, tiny_config
from testpaths import REPO

ROOT = REPO

# override -> the message after "<config>: "
OUT_OF_RANGE = {
    "train.adam_beta2=1.5": "train.adam_beta2=1.5: expected a float in [0, 1) (an exponential decay rate)",
    "train.adam_beta1=1.0": "train.adam_beta1=1.0: expected a float in [0, 1) (an exponential decay rate)",
    "train.muon_momentum=-1": "train.muon_momentum=-1.0: expected a float in [0, 1) (an exponential decay rate)",
    "train.adam_eps=-1e-8": "train.adam_eps=-1e-08: expected a float >= 0",
    "train.weight_decay=-0.1": "train.weight_decay=-0.1: expected a float >= 0",
    "train.tokens_per_parameter=-20": "train.tokens_per_parameter=-20.0: expected a positive number "
                                      "(the Chinchilla token budget, 20 in the paper)",
    "train.train_tokens=0": "train.train_tokens=0: expected null or a positive integer",
}
CONTRADICTIONS = {
    "model.history_window=3": "model.history_window=3: expected 1 (the default) unless history_injection is set",
    "train.loop_sampling_sigma=0.9": "train.loop_sampling_sigma=0.9: expected its default 0.5 with "
                                     "loop_sampling='fixed'",
    "train.loop_sampling_max=6": "train.loop_sampling_max=6: expected its default None with loop_sampling='fixed'",
    "train.eval_loops=[]": "train.eval_loops=[]: expected null (K/2, K, 2K) or a non-empty list of loop counts; "
                           "to train without validation set train.eval_interval: 0",
    "train.eval_batches=0": "train.eval_batches=0: expected a positive integer (micro-batches per validation; "
                            "to train without validation set train.eval_interval: 0)",
}


@pytest.mark.parametrize("override", [*OUT_OF_RANGE, *CONTRADICTIONS])
def test_bad_value_is_refused_at_load_naming_the_key(override, tmp_path):
    config = tiny_config(tmp_path)
    with pytest.raises(LoopConfigError) as e:
        load_config(config, [override])
    expected = {**OUT_OF_RANGE, **CONTRADICTIONS}[override]
    assert str(e.value).startswith(f"{config}: {expected}"), str(e.value)


def test_the_paper_values_and_the_edges_of_the_ranges_still_load(tmp_path):
    config = tiny_config(tmp_path)
    cfg = load_config(config, ["train.adam_beta1=0", "train.adam_beta2=0.999", "train.muon_momentum=0.0",
                               "train.adam_eps=0", "train.weight_decay=0", "train.tokens_per_parameter=0.5",
                               "model.history_injection=scalar", "model.history_window=3",
                               "train.loop_sampling=uniform", "train.loop_sampling_max=3"])
    assert (cfg.train.adam_beta2, cfg.model.history_window, cfg.train.loop_sampling_max) == (0.999, 3, 3)


def test_duplicate_yaml_key_names_both_lines(tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("model:\n  train_loops: 2\ntrain:\n  lr: 1.0e-3\n  seq_length: 32\n  lr: 3.0e-3\n")
    with pytest.raises(LoopConfigError) as e:
        load_config(config)
    assert str(e.value) == (f"{config}: duplicate key 'lr' at line 6 (first at line 4); "
                            "expected each key once in a mapping")
    config.write_text("model:\n  train_loops: 2\nmodel:\n  train_loops: 3\n")
    with pytest.raises(LoopConfigError, match="duplicate key 'model' at line 3 \\(first at line 1\\)"):
        load_config(config)


@pytest.mark.parametrize("override", ["train.adam_beta2=1.5", "train.tokens_per_parameter=-20"])
def test_cli_and_dry_run_print_one_error_line_and_write_nothing(override, tmp_path):
    """Before: adam_beta2=1.5 failed inside the first optimizer step, tokens_per_parameter=-20 was a
    traceback in the dry run. Both the dry run and training stop at load now."""
    config = tiny_config(tmp_path)
    for extra in (["--dry-run"], []):
        r = subprocess.run([sys.executable, str(ROOT / "pretrain_loop.py"), "--config", str(config),
                            "--set", override, "--set", "train.max_steps=null", *extra],
                           cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
        assert r.stderr.splitlines() == [f"error: {config}: {OUT_OF_RANGE[override]}"], r.stderr[-2000:]
        assert not (tmp_path / "run").exists()


def test_hf_config_refuses_history_window_zero():
    """Before: LoopLMConfig(history_window=0) loaded and the weights then failed with a size mismatch."""
    from megatron_loop.hf.modeling_looplm import LoopLMConfig

    with pytest.raises(ValueError) as e:
        LoopLMConfig(history_injection="scalar", history_window=0)
    assert str(e.value) == ("LoopLMConfig.history_window=0: expected an integer >= 1 "
                            "(the number of past states the history injection reads)")
    assert LoopLMConfig(history_injection="scalar", history_window=2).history_window == 2
