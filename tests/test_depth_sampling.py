"""Sampled loop counts in training: ``train.loop_sampling``.

The step's loop count is a pure function of (config, seed, step): deterministic, untouched by
the global RNG streams, with mean K; every micro-batch of a step and both of 2 gloo ranks run the
same k, a resumed run continues with the very draws of the remaining steps, and metrics.jsonl
records them. The paper's setting spelled through the new code paths (a degenerate uniform range
k = K, backprop_loops = K) reproduces the default run bit for bit. (The default run itself was
checked against the code before this change: identical losses, gradient norms, validation losses
and final weights on the tiny run.)
"""

from __future__ import annotations

import json
import random
import statistics

import numpy as np
import pytest
import torch

from megatron_loop import LoopConfigError
from megatron_loop.config import config_from_dict
from megatron_loop.training.loop_sampling import sample_train_loops
from train_fixtures import (REPO, assert_same_weights, check_ok, final_weights, losses, records, reference_run,
                            run_cli, tiny_config)

RECORD = str(REPO / "tests" / "train_scripts" / "record_loops.py")


def _cfg(model=None, **train):
    return config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4, "initial_injection": "scalar",
                                       **(model or {})}, "train": train}, source="c.yaml")


@pytest.mark.parametrize("model,train,message", [
    ({}, {"loop_sampling": "gamma"}, "train.loop_sampling='gamma': expected one of ('fixed', 'poisson_lognormal', 'uniform')"),
    ({}, {"loop_sampling_sigma": 0.0}, "train.loop_sampling_sigma=0.0: expected a positive float"),
    ({}, {"loop_sampling_min": 0}, "train.loop_sampling_min=0: expected an integer >= 1"),
    ({}, {"loop_sampling_min": 3, "loop_sampling_max": 2}, "train.loop_sampling_max=2: expected null or an integer >= loop_sampling_min=3"),
    ({}, {"backprop_loops": 0}, "train.backprop_loops=0: expected null (backpropagate through every loop) or an integer >= 1"),
    ({"train_loops": 1}, {"loop_sampling": "poisson_lognormal"}, "with model.train_loops=1: expected train_loops >= 2"),
    ({}, {"loop_sampling": "uniform", "loop_sampling_min": 5}, "train.loop_sampling_min=5: expected at most model.train_loops=4"),
    ({"initial_injection": "none"}, {"backprop_loops": 2},
     "train.backprop_loops=2: with model.initial_injection='none' the loops that run without a graph cut the embedding"),
])
def test_bad_settings_name_the_key(model, train, message):
    with pytest.raises(LoopConfigError) as err:
        _cfg(model, **train)
    assert str(err.value).startswith("c.yaml: ") and message in str(err.value)


def test_truncation_without_injection_is_allowed_when_nothing_is_truncated():
    cfg = _cfg({"initial_injection": "none"}, loop_sampling="uniform", loop_sampling_max=6, backprop_loops=6)
    assert cfg.train.backprop_loops == 6


def test_draws_are_a_function_of_seed_and_step_only():
    cfg = _cfg(loop_sampling="poisson_lognormal").train
    draws = [sample_train_loops(cfg, 4, s) for s in range(200)]
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    torch.rand(5), np.random.rand(5), random.random()  # global streams move: the draws do not
    assert [sample_train_loops(cfg, 4, s) for s in range(200)] == draws
    assert len(set(draws)) > 3  # really sampled
    other = _cfg(loop_sampling="poisson_lognormal", seed=7).train
    assert [sample_train_loops(other, 4, s) for s in range(200)] != draws
    assert sample_train_loops(_cfg().train, 4, 17) == 4  # fixed: K


def test_distributions_have_mean_k_and_respect_the_range():
    n = 2000
    pln = [sample_train_loops(_cfg(loop_sampling="poisson_lognormal").train, 4, s) for s in range(n)]
    assert min(pln) >= 1 and statistics.mean(pln) == pytest.approx(4, abs=0.2)  # E[1 + Poisson(lognormal)] = K
    assert max(pln) >= 10  # Huginn's heavy right tail
    uni = [sample_train_loops(_cfg(loop_sampling="uniform").train, 4, s) for s in range(n)]
    assert set(uni) == set(range(1, 8)) and statistics.mean(uni) == pytest.approx(4, abs=0.2)  # U{1..2K-1}
    clipped = _cfg(loop_sampling="poisson_lognormal", loop_sampling_min=2, loop_sampling_max=6).train
    assert {sample_train_loops(clipped, 4, s) for s in range(n)} == set(range(2, 7))


def test_paper_setting_through_the_new_paths_is_the_default_run_bit_for_bit(tmp_path):
    """k drawn from the range {K} with backprop_loops = K: every new code path taken, nothing changed."""
    ref = reference_run()
    run = tmp_path / "run"
    check_ok(run_cli("--config", str(ref.config), "--set", f"train.output_dir={run}",
                     "--set", "train.loop_sampling=uniform", "--set", "train.loop_sampling_min=2",
                     "--set", "train.loop_sampling_max=2", "--set", "train.backprop_loops=2"))
    assert losses(run) == losses(ref.run_dir)
    assert records(run, "eval") == records(ref.run_dir, "eval")
    assert_same_weights(final_weights(ref.run_dir), final_weights(run))
    assert [r["train_loops"] for r in records(ref.run_dir, "train")] == [2] * 10


def test_sampled_loops_are_equal_on_every_rank_micro_batch_and_across_resume(tmp_path):
    """2 gloo ranks, 2 micro-batches per rank and step; stopped after step 2 (exit_interval) and
    resumed to step 4: every training forward of both ranks ran the draw of its step."""
    steps, k = 4, 3
    config = tiny_config(tmp_path, model={"train_loops": k, "initial_injection": "scalar"},
                         train={"max_steps": steps, "save_interval": 100, "eval_interval": 0,
                                "loop_sampling": "poisson_lognormal", "backprop_loops": 1})
    rec = tmp_path / "calls"
    common = (str(rec), "--config", str(config))
    check_ok(run_cli(*common, "--set", "train.exit_interval=2", nproc=2, launcher="torchrun", script=RECORD))
    resumed = run_cli(*common, nproc=2, launcher="torchrun", script=RECORD)
    check_ok(resumed)
    assert "resuming from" in resumed.stdout + resumed.stderr

    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": k, "initial_injection": "scalar"},
                            "train": {"loop_sampling": "poisson_lognormal", "backprop_loops": 1}})
    expected = [sample_train_loops(cfg.train, k, s) for s in range(steps)]
    assert len(set(expected)) > 1, expected  # the seed gives several depths in these steps
    per_rank = [[json.loads(line) for line in (tmp_path / f"calls.rank{r}.jsonl").read_text().splitlines()]
                for r in (0, 1)]
    assert per_rank[0] == per_rank[1]
    accumulation = 2  # global 8 = micro 2 x 2 micro-batches x 2 ranks
    assert [c[0] for c in per_rank[0]] == [n for n in expected for _ in range(accumulation)]
    for num_loops, backprop, grid in per_rank[0]:
        assert backprop == 1 and grid == (None if num_loops == k else "rescaled")  # psi on the grid of the draw
    run = tmp_path / "run"
    assert [r["train_loops"] for r in records(run, "train")] == expected
    assert [r["step"] for r in records(run, "resume")] == [2]
