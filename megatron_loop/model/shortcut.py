"""LoopFormer's shortcut-consistency training on variable-length trajectories.

Jeddi, Ciccone and Taati, "LoopFormer: Elastic-Depth Looped Transformers for Latent Reasoning via
Shortcut Modulation" (ICLR 2026); compared with the authors' code, armenjeddi/loopformer:
``train.py`` (the ``model_type == 'loopformer'`` step), ``utils.py`` (``sample_short_trajectory``)
and ``models/loopformer.py`` (``GPT.forward``'s loop over step sizes).

Trajectory. A loop schedule from t = 0 to t = 1 in M steps of sizes dt_l = n_l / K (the positive
integers n_l sum to K = ``model.train_loops``); loop l runs at t_l = (n_0 + ... + n_{l-1}) / K with
dt_l (``trajectory_times`` of the export). The full trajectory is n = (1, ..., 1): t_l = l / K,
dt = 1 / K, the training grid (bitwise). The conditioning reads (t_l, dt_l): LoopFormer's shortcut
modulation (``model.timestep: shortcut``, ``conditioning.ShortcutEmbedding``) or, composed with this
paper's mechanisms, psi(t_l, dt_l) of Eq. (timestep_features) for LG / BG / AdaLN; without timestep
conditioning only M matters (LoopFormer's ``base_loop`` early-exit variant draws M the same way).

Training step (``train.shortcut_consistency``), one :class:`ShortcutTrajectory` per micro-batch:

    L = CE(x_full) + w_short CE(x_short) + w_cons MSE(sg(x_full), x_short),   w_short = w_cons = 0.1,

x the final normed hidden states (the LM head's input: LoopFormer's ``x`` after ``norm_f``), the
full trajectory's detached (``F.mse_loss(x1.detach(), x2)``: consistency pulls the short route to the
full one, never the reverse); the MSE averages over batch, positions and channels. Both passes run
inside ``LoopLM.forward`` (:func:`shortcut_objective`), so ZeRO, TP and bf16 see one forward; the loss
is the chunked cross-entropy (no full-vocabulary logits). Cost: K + M loops forward and backward,
E[M] = K / 2, about 1.5x the loops of a fixed-K step (LoopFormer reports ~1.5x training FLOPs).

Sampler (:func:`sample_short_trajectory`, LoopFormer's ``sample_short_trajectory``): M ~ U{1..K-1};
for each step but the last, n ~ U{1..R - (steps left after it)} with R the units still to go (every
later step keeps at least 1/K); the last step takes the rest. LoopFormer draws anew for every
micro-batch (inside its gradient-accumulation loop); here the draw is stateless, a NumPy generator
seeded with (stream, ``train.seed``, step, micro-batch): redrawn exactly after a resume, no global
RNG stream consumed. Unlike LoopFormer's DDP ranks (each seeded with its rank), every rank draws the
same trajectory: ZeRO 3 gathers each block's parameters with a collective per call, so all
data-parallel ranks must run the same number of loops (a rank-dependent M deadlocks the gathers), and
the ranks of a tensor-parallel group compute one model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from megatron_loop.errors import LoopConfigError
from megatron_loop.hf import modeling_looplm as export
from megatron_loop.model.conditioning import timestep_times, trajectory_times

# Separates this stream from the loop-count sampler's and any other use of (seed, step).
_STREAM = 0x5C07
# LoopFormer's weights (train.py): loss_ntp = loss1 + 0.1 * loss2; loss = loss_ntp + 0.1 * loss_consistency
SHORT_LOSS_WEIGHT = 0.1
CONSISTENCY_WEIGHT = 0.1


@dataclass(frozen=True)
class ShortcutTrajectory:
    """One step's short trajectory (step sizes n_l / K) and the weights of its two losses."""

    steps: tuple[int, ...]
    short_loss_weight: float = SHORT_LOSS_WEIGHT
    consistency_weight: float = CONSISTENCY_WEIGHT


def sample_short_trajectory(train_loops: int, seed: int, step: int, micro: int = 0) -> tuple[int, ...]:
    """The short trajectory (n_0, ..., n_{M-1}) of micro-batch ``micro`` of optimizer step ``step``, on
    every rank: a pure function of K, ``seed``, ``step`` and ``micro`` (module docstring)."""
    if train_loops < 2:
        raise LoopConfigError(f"train.shortcut_consistency=true with model.train_loops={train_loops}: expected "
                              "train_loops >= 2 (a short trajectory has 1..K-1 steps)")
    rng = np.random.default_rng([_STREAM, seed, step, micro])
    count = int(rng.integers(1, train_loops))  # M ~ U{1..K-1}
    remaining, steps = train_loops, []
    for left in range(count, 1, -1):  # `left` steps still to take, this one included
        n = int(rng.integers(1, remaining - (left - 1) + 1))
        steps.append(n)
        remaining -= n
    return (*steps, remaining)


def shortcut_trajectory(train, train_loops: int, step: int, micro: int = 0) -> ShortcutTrajectory | None:
    """The objective a training step's micro-batch passes to the model (None unless ``train.shortcut_consistency``;
    :class:`megatron_loop.training.step.TrainStep`)."""
    if not train.shortcut_consistency:
        return None
    return ShortcutTrajectory(sample_short_trajectory(train_loops, train.seed, step, micro),
                              train.shortcut_short_loss_weight, train.shortcut_consistency_weight)


def timestep_inputs(model, r: int, grid: str, device: torch.device, loop_steps: tuple[int, ...] | None = None,
                    direct: bool = False) -> torch.Tensor:
    """Row l: what loop l's timestep modules read, on the grid of r or along ``loop_steps``.

    Shortcut modulation: c_l = ShortcutEmbedding(t_l, dt_l) (a function of parameters: computed every
    forward, over the grid's whole horizon then the first r rows, as the export does; ``direct``: from
    the weights, without module calls, for readers outside a forward); psi_l otherwise (constants,
    built once per trajectory and device: at most 2^(K-1) trajectories)."""
    k = model.config.train_loops
    if loop_steps is not None:
        key = ("trajectory", tuple(int(n) for n in loop_steps), device)
        times = lambda: trajectory_times(loop_steps, k)  # noqa: E731 (validated here, once per key)
    else:
        key = ("times", r, grid, device)
        times = lambda: timestep_times(r, k, grid)  # noqa: E731
    if model.shortcut_embedding is None:  # psi along the trajectory, Eq. (timestep_features)
        return model._constant(("psi",) + key, lambda: export.psi_features(*times()).to(device, torch.float32))
    t, dt = model._constant(key, lambda: torch.stack(times()).float().to(device))  # fp32, as the export
    if direct:
        return model.shortcut_embedding.forward(t, dt, direct=True)[:r]
    return model.shortcut_embedding(t, dt)[:r]


def shortcut_consistency_loss(full: torch.Tensor, short: torch.Tensor, tp_size: int = 1) -> torch.Tensor:
    """MSE(sg(x_full), x_short): the mean over every element of the squared difference, in fp32 (float64
    stays float64), with no gradient into ``full``.

    Under tensor parallelism both are the head input, whole on every rank, whose backward sums the
    ranks' gradients (the vocabulary shards' partial sums, ``model/vocab.py`` ``head_input``): the
    MSE, the same on every rank, would reach x_short ``tp_size`` times, so its gradient is divided by
    ``tp_size`` (its value is not)."""
    dtype = torch.promote_types(short.dtype, torch.float32)
    loss = (short.to(dtype) - full.detach().to(dtype)).pow(2).mean()
    if tp_size > 1:
        loss = loss / tp_size + (loss - loss / tp_size).detach()
    return loss


def shortcut_objective(model, input_ids: torch.Tensor, labels: torch.Tensor | None,
                       run) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LoopFormer's training loss (module docstring) and the full trajectory's logits (if asked for) of the
    forward ``run`` (its :class:`~megatron_loop.model.options.LoopOptions`, ``objective`` the step's
    :class:`ShortcutTrajectory`): both passes keep every other option of the step."""
    spec = run.objective
    if labels is None:
        raise LoopConfigError("LoopLM.forward(objective=ShortcutTrajectory(...)): LoopFormer's shortcut-consistency "
                              "objective needs labels")
    full = model.forward(input_ids, labels, run.but(objective=None, return_hidden=True))
    short = model.forward(input_ids, labels, run.but(objective=None, compute_logits=False, return_hidden=True,
                                                     loop_steps=tuple(spec.steps)))
    consistency = shortcut_consistency_loss(full.hidden, short.hidden, model.tensor_parallel.placement.tp_size)
    loss = full.loss + spec.short_loss_weight * short.loss + spec.consistency_weight * consistency
    return loss, full.logits
