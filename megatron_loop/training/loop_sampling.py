"""Loop count per micro-batch (or per optimizer step): ``train.loop_sampling``, ``train.loop_sampling_per``.

The paper trains every step with exactly K = ``model.train_loops`` loops (App. C.2). Recurrent-
depth models in the wild sample the count instead, so that the model sees many depths and can
be run at any r afterwards:

``fixed``
    k = K at every step (the paper; the default).
``poisson_lognormal``
    Huginn's schedule (Geiping et al. 2025, arXiv 2502.05171, Sec. 3.3, Eq. (2);
    seal-rg/recurrent-pretraining ``recpre/model_dynamic.py::randomized_iteration_sampler``,
    scheme "poisson-lognormal-filling", the one its released model trained with):
    lambda ~ LogNormal(mu, sigma), k = 1 + Poisson(lambda), mu = ln(K - 1) - sigma^2 / 2,
    so E[lambda] = K - 1, E[k] = K and Var[k] = (K - 1) + (K - 1)^2 (e^{sigma^2} - 1).
    Huginn writes the same draw with its mean recurrence M = ``mean_recurrence`` in place of
    K - 1: mu = ln(t + s) - sigma^2 / 2 with t + s = M, p = Poisson(lambda) + 1, so its steps
    have mean M + 1 (M = 32: 33 loops on average). Our K is that mean: K = M + 1 is Huginn's
    sampler exactly (``tests/unit/training/test_loop_sampling.py`` compares the two). A heavy
    right tail: most steps are short, a few are deep. ``train.loop_sampling_sigma`` is sigma
    (Huginn: 0.5, fixed); ``loop_sampling_min`` / ``loop_sampling_max`` clip the draw (default:
    no clipping, as Huginn).
    Huginn draws once per micro-batch (``train.py:397-398``: ``state["microbatch_step"] += 1;
    model.step = state["microbatch_step"]``, and ``model_dynamic.py:1258`` seeds the draw with
    514229 + that step), so one update averages the gradients of several depths; so do we
    (``loop_sampling_per: micro_batch``, the default). Its released run sets ``lockstep_n: True``
    (``launch_configs/frontier_nebel_512_nodes.yaml:22``): every rank draws the same depth for the same
    micro-batch (its default ``lockstep_n = False`` would multiply the seed by rank + 1,
    ``model_dynamic.py:1260-1261``); here too, every rank runs the same k (no rank waits for a deeper
    one). Where Huginn differs: (a) it seeds a torch generator with its global micro-batch counter,
    we a NumPy one with (``train.seed``, step, micro-batch): the same property -- a pure function of
    the micro-batch's place in the run -- not the same numbers. (b) Huginn's
    evaluation runs M = K - 1 loops; ours the training K (``train.eval_loops``). (c) Huginn
    starts from a (M - B) + B split of its mean, which for M < B averages B + 1 instead of M + 1.
``uniform``
    k ~ U{min, max} (both inclusive), ``max`` = 2K - min when null, so E[k] = K (Parcae-style
    per-batch sampling).

``train.loop_sampling_per``: ``micro_batch`` (the default, Huginn's) draws k for each micro-batch
of a step, so an update averages several depths; ``step`` draws one k per optimizer step, every
micro-batch of the step running it (one depth per update: a step's time is one depth's, and the
gradient is that depth's).

The draw is *stateless*: a NumPy generator seeded with (``train.seed``, step index[, micro-batch
index]) and nothing else. Every data-parallel rank therefore uses the same k for the same micro-batch
without any communication (lockstep, as Huginn's released run), no global RNG stream is consumed (the data order, the initialisation and the
fixed-K run stay bit for bit what they were), and a resumed run redraws exactly the k of every
remaining step from the restored step counter, with no extra checkpoint state.

Timestep conditioning of a step with k loops uses the grid of k (T = k, the ``rescaled`` grid,
which for k = K is the paper's training grid T = K).

Truncated backpropagation (``train.backprop_loops: N``) is applied in ``LoopLM.forward``: the
first k - N loops run without a graph, i.e. min(N, k) loops are graphed -- Huginn's split of a
draw p into n = max(p - B, 0) steps under ``torch.no_grad()`` and k = min(B, p) with gradients,
B = ``mean_backprop_depth`` (8 of its 32 + 1), the last steps being the graphed ones in both. It cuts the embedding and the Prelude off from the
gradient unless h0 reaches the graphed loops through an initial-state injection, as in Huginn
and Parcae; :func:`megatron_loop.config.check_loop_sampling` refuses that combination when the
config is loaded.
"""

from __future__ import annotations

import math

import numpy as np

from megatron_loop.config import TrainConfig, loop_range

# Separates this stream from any other use of (seed, step) as entropy.
_STREAM = 0x100F


def sample_train_loops(train: TrainConfig, train_loops: int, step: int, micro: int = 0) -> int:
    """The loop count k of micro-batch ``micro`` of optimizer step ``step`` (both 0-based), a pure function
    of the config, ``train.seed``, ``step`` and -- with ``loop_sampling_per: micro_batch`` -- ``micro``
    (see the module docstring); never of the rank."""
    if train.loop_sampling == "fixed":
        return train_loops
    per_micro_batch = getattr(train, "loop_sampling_per", "micro_batch") == "micro_batch"
    rng = np.random.default_rng([_STREAM, train.seed, step, micro] if per_micro_batch else [_STREAM, train.seed, step])
    low, high = loop_range(train, train_loops)
    if train.loop_sampling == "uniform":
        return int(rng.integers(low, high + 1))
    sigma = train.loop_sampling_sigma
    rate = rng.lognormal(mean=math.log(train_loops - 1) - sigma**2 / 2, sigma=sigma)
    k = 1 + int(rng.poisson(rate))
    return max(low, k if high is None else min(k, high))
