"""Loop count per optimizer step: ``train.loop_sampling``.

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
    Where Huginn differs: (a) with its default ``lockstep_n = False`` each rank seeds its own
    draw (seed x (rank + 1)), so data-parallel ranks run different depths; here every rank runs
    the same k (no rank waits for a deeper one, and the step is one depth). (b) Huginn's
    evaluation runs M = K - 1 loops; ours the training K (``train.eval_loops``). (c) Huginn
    starts from a (M - B) + B split of its mean, which for M < B averages B + 1 instead of M + 1.
``uniform``
    k ~ U{min, max} (both inclusive), ``max`` = 2K - min when null, so E[k] = K (Parcae-style
    per-batch sampling).

The draw is *stateless*: a NumPy generator seeded with (``train.seed``, step index) and nothing
else. Every data-parallel rank and every micro-batch of a step therefore uses the same k without
any communication, no global RNG stream is consumed (the data order, the initialisation and the
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


def sample_train_loops(train: TrainConfig, train_loops: int, step: int) -> int:
    """The loop count k of optimizer step ``step`` (0-based), a pure function of the config,
    ``train.seed`` and ``step`` (see the module docstring)."""
    if train.loop_sampling == "fixed":
        return train_loops
    rng = np.random.default_rng([_STREAM, train.seed, step])
    low, high = loop_range(train, train_loops)
    if train.loop_sampling == "uniform":
        return int(rng.integers(low, high + 1))
    sigma = train.loop_sampling_sigma
    rate = rng.lognormal(mean=math.log(train_loops - 1) - sigma**2 / 2, sigma=sigma)
    k = 1 + int(rng.poisson(rate))
    return max(low, k if high is None else min(k, high))
