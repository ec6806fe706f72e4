"""Loop count per optimizer step: ``train.loop_sampling``.

The paper trains every step with exactly K = ``model.train_loops`` loops (App. C.2). Recurrent-
depth models in the wild sample the count instead, so that the model sees many depths and can
be run at any r afterwards:

``fixed``
    k = K at every step (the paper; the default).
``poisson_lognormal``
    Huginn's schedule (Geiping et al. 2025, seal-rg/recurrent-pretraining,
    ``recpre/raven_modeling_minimal.py::randomized_iteration_sampler``):
    lambda ~ LogNormal(mu, sigma), k = 1 + Poisson(lambda), mu = ln(K - 1) - sigma^2 / 2,
    so E[lambda] = K - 1 and E[k] = K (Huginn's own mean is ``mean_recurrence + 1``: its
    mu uses ln(mean_recurrence)). A heavy right tail: most steps are short, a few are deep.
    ``train.loop_sampling_sigma`` is sigma (Huginn: 0.5); ``loop_sampling_min`` /
    ``loop_sampling_max`` clip the draw (default: no clipping, as Huginn).
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
first k - N loops run without a graph. It cuts the embedding and the Prelude off from the
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
