"""``training/loop_sampling.py`` and the ``train.loop_sampling`` / ``train.backprop_loops`` settings
(``config/validation.py``): the step's loop count is a pure function of (config, seed, step):
deterministic, untouched by the global RNG streams, with mean K, within the configured range; bad
settings name the key. (Runs with sampled loops, 2 ranks and a resume:
tests/integration/training/test_loop_sampling_runs.py.)"""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
import torch

from megatron_loop import LoopConfigError
from megatron_loop.config import config_from_dict
from megatron_loop.config.validation import loop_range
from megatron_loop.training.loop_sampling import sample_train_loops


def _cfg(model=None, **train):
    return config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4, "initial_injection": "scalar",
                                       **(model or {})}, "train": train}, source="c.yaml")


@pytest.mark.parametrize("model,train,message", [
    ({}, {"loop_sampling": "gamma"}, "train.loop_sampling='gamma': expected one of ('fixed', 'poisson_lognormal', 'uniform')"),
    ({}, {"loop_sampling_sigma": 0.0}, "train.loop_sampling_sigma=0.0: expected a positive float"),
    ({}, {"loop_sampling": "uniform", "loop_sampling_per": "update"},
     "train.loop_sampling_per='update': expected one of ('micro_batch', 'step')"),
    ({}, {"loop_sampling_per": "step"}, "train.loop_sampling_per='step': expected its default 'micro_batch' with "
                                        "loop_sampling='fixed'"),
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
    """backprop_loops = the largest draw: no loop runs without a graph, so the embedding keeps its
    gradient without an injection; one loop more in the range and the same setting truncates (refused)."""
    cfg = _cfg({"initial_injection": "none"}, loop_sampling="uniform", loop_sampling_max=6, backprop_loops=6)
    assert loop_range(cfg.train, 4) == (1, 6)
    draws = {sample_train_loops(cfg.train, 4, s) for s in range(500)}
    assert draws == set(range(1, 7)) and max(draws) - cfg.train.backprop_loops == 0  # no loop without a graph
    with pytest.raises(LoopConfigError, match=r"train.backprop_loops=6: with model.initial_injection='none' the "
                                              r"loops that run without a graph cut the embedding .* or "
                                              r"train.backprop_loops null or >= 7 \(the largest loop count\)"):
        _cfg({"initial_injection": "none"}, loop_sampling="uniform", loop_sampling_max=7, backprop_loops=6)


def test_huginn_draws_per_micro_batch_in_lockstep_and_the_per_step_draw_stays_by_name():
    """``loop_sampling_per: micro_batch`` (the default; Huginn's train.py:397-398 draws per micro-batch): the
    micro-batches of one update run different depths, every rank the same ones (TrainStep of rank 0 and 1;
    Huginn's released run sets lockstep_n); ``step``: one depth per update, the draw of (seed, step)."""
    from megatron_loop.training.step import TrainStep

    cfg = _cfg(loop_sampling="poisson_lognormal")
    updates = [TrainStep(cfg.train, cfg.model, rank=0).step_loops(s, 8) for s in range(20)]
    assert updates == [TrainStep(cfg.train, cfg.model, rank=1).step_loops(s, 8) for s in range(20)]
    assert all(len(set(u)) > 1 for u in updates)  # 8 micro-batches: several depths in every update
    assert statistics.mean(n for u in updates for n in u) == pytest.approx(4, abs=0.4)
    per_step = _cfg(loop_sampling="poisson_lognormal", loop_sampling_per="step")
    steps = [TrainStep(per_step.train, per_step.model).step_loops(s, 8) for s in range(20)]
    assert all(len(set(u)) == 1 for u in steps) and len({u[0] for u in steps}) > 1
    rng = np.random.default_rng([0x100F, 42, 3])  # the per-step stream: (seed, step), as before micro-batches
    sigma = per_step.train.loop_sampling_sigma
    assert steps[3][0] == 1 + int(rng.poisson(rng.lognormal(mean=math.log(3) - sigma**2 / 2, sigma=sigma)))


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


def test_poisson_lognormal_is_huginns_sampler_with_k_its_mean_plus_one():
    """Huginn's "poisson-lognormal-filling" (recpre/model_dynamic.py::randomized_iteration_sampler), written
    here from its definition with torch's samplers: M = mean_recurrence, B = mean_backprop_depth,
    lambda ~ LogNormal(ln M - sigma^2/2, 0.5), p = Poisson(lambda) + 1, n = max(p - B, 0) steps without a
    graph and min(B, p) with one. Ours with K = M + 1 and backprop_loops = B: the same law of p (mean M + 1,
    variance M + M^2 (e^{sigma^2} - 1)) and the same graphed split (LoopLM.forward: max(r - N, 0) loops
    without a graph, flops.graphed_loops)."""
    from megatron_loop.flops import graphed_loops

    m, b, sigma, n = 5, 2, 0.5, 6000
    cfg = _cfg({"train_loops": m + 1}, loop_sampling="poisson_lognormal", backprop_loops=b)
    ours = np.array([sample_train_loops(cfg.train, m + 1, s) for s in range(n)])
    g = torch.Generator().manual_seed(0)
    rate = torch.zeros(n).log_normal_(mean=math.log(m) - sigma**2 / 2, std=sigma, generator=g)
    huginn = (torch.poisson(rate, generator=g) + 1).long().numpy()
    var = m + m**2 * (math.exp(sigma**2) - 1)
    for draws in (ours, huginn):
        assert abs(draws.mean() - (m + 1)) < 4 * math.sqrt(var / n)  # E[p] = M + 1 = K
        assert draws.var() == pytest.approx(var, rel=0.12)
    top = max(ours.max(), huginn.max()) + 1
    tv = 0.5 * np.abs(np.bincount(ours, minlength=top) / n - np.bincount(huginn, minlength=top) / n).sum()
    assert tv < 0.05  # the same distribution (sampling noise of two 6000-draw histograms: ~0.02)
    for p in range(1, 12):  # Huginn's n = max(p - B, 0) without a graph, k = min(B, p) with one
        assert graphed_loops(cfg.model, p, cfg.train.backprop_loops) == min(b, p)
        assert p - graphed_loops(cfg.model, p, cfg.train.backprop_loops) == max(p - b, 0)
