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
    "data.max_epochs=0": "data.max_epochs=0.0: expected a positive number of epochs",
    "train.divergence_lr_factor=1": "train.divergence_lr_factor=1.0: expected null or a number in (0, 1) (the lr of "
                                    "a resume after a stop on non-finite values, per stop, e.g. 0.5)",
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
    assert str(e.value) == ("LoopLMConfig.history_window=0: expected an integer from 1 to 1024 "
                            "(the number of past states the history injection reads)")
    assert LoopLMConfig(history_injection="scalar", history_window=2).history_window == 2


def test_alias_bomb_is_one_line_at_the_cli_and_training_refuses_a_plan_beyond_memory(tmp_path):
    """Issue 33/35: a "billion laughs" YAML (9^10 values once expanded; before, no output for minutes)
    stops the command at once with one error line, exit 2; train.max_steps=1e18 (before: a minute
    building the data plan, then numpy's _ArrayMemoryError) is refused by the step count training
    computes before any process group or loader (training/setup.py; the dry run's refusal through
    the CLI: tests/unit/test_dryrun.py)."""
    import time

    from megatron_loop.plan import total_train_steps

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("data:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)))
    start = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "pretrain_loop.py"), "--config", str(bomb), "--dry-run"],
                       cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and time.perf_counter() - start < 30, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"error: {bomb}: data.l5: its aliases expand it to more than 100,000 values (line 7; nested aliases "
        "multiply, a 'billion laughs' document); expected a config of plain values"]
    cfg = load_config(tiny_config(tmp_path), ["train.max_steps=1e18"])
    with pytest.raises(LoopConfigError, match=r"^train\.max_steps=1000000000000000000 x train\.global_batch_size=8 "
                                              r"= 8,000,000,000,000,000,000 samples: the data plan's index needs"):
        total_train_steps(cfg)


def test_list_configs_names_each_run_yaml(capsys):
    """``--list-configs`` is readable: each run's name and YAML file, the file there, lines a terminal holds; the
    rest of each run (``--details``) keeps the name and the file first."""
    from megatron_loop.registry import RUNS
    from testpaths import load_script

    assert load_script("pretrain_loop.py").main(["--list-configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "config"] and max(len(line) for line in out[:len(RUNS) + 1]) <= 140
    assert out[len(RUNS) + 1] == ("each run's family, layout, depths, conditioning, parameters, loop sweep and paper "
                                  "figures: python pretrain_loop.py --list-configs --details")
    rows = {line.split()[0]: line.split()[1] for line in out[1:len(RUNS) + 1]}
    assert load_script("pretrain_loop.py").main(["--list-configs", "--details"]) == 0
    detailed = capsys.readouterr().out.splitlines()
    assert detailed[0].split()[:3] == ["name", "config", "family"]
    assert {line.split()[0]: line.split()[1] for line in detailed[1:len(RUNS) + 1]} == rows
    assert set(rows) == set(RUNS)
    assert rows["llama_4x5"] == "examples/llama_4x5.yaml"
    assert rows["qwen_4x7_hist_scalar_w1"] == "examples/paper/qwen/history_injection/qwen_4x7_hist_scalar_w1.yaml"
    assert all((ROOT / path).is_file() for path in rows.values())
