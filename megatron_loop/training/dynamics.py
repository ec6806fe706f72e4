"""Loop dynamics while training: what the recurrence does, every ``logging.dynamics_interval`` steps.

A LoopLM researcher watches the recurrent state, not only the loss: does the Core converge to a
fixed point or keep moving, what do the timestep gates learn, how does the loss react to one loop
less or more than K (the first finding's question, Sec. 3, asked during training). On the first
held-out batch (the same tokens every time, so the curves compare across steps), under
``torch.no_grad``:

* ``state_norm_l{l}``, l = 0..K+1: the mean per-token RMS of the state h_l (h_0 the Prelude
  output), from one forward at r = K + 1;
* ``relative_update_l{l}``, l = 1..K+1: the mean per-token ||h_l - h_{l-1}|| / ||h_{l-1}||;
* ``batch_loss_r{r}`` for r = K - 1 (if K > 1), K, K + 1: the held-out loss of this batch at r loops;
* the timestep gates at the training depth (psi_l on the training grid, l = 1..K, Eq.
  (timestep_features)): ``loop_gate_l{l}`` = 1 + q^T psi_l (Loop Gating, Eq.
  (loop_level_timestep_gating)); ``branch_gate_{attn,mlp}_l{l}`` (Branch Gating, Eq.
  (branch_level_timestep_gating)) and ``adaln_scale_{attn,mlp}_l{l}`` (the mean channel scale g
  of AdaLN, Eq. (adaln_timestep_parameters)), each averaged over the Core's blocks.

Cost: three no-grad forwards of one micro-batch (r = K - 1, K, K + 1) every interval, against
three forward-equivalents per micro-batch per training step: at the default interval of 250
steps, under 0.5 % of the training compute. Every rank runs the forwards (tensor-parallel layers
and ZeRO-3 gather inside them) and the numbers are averaged over ranks (data-parallel shards of
the held-out set).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from megatron_loop.model.shortcut import timestep_inputs
from megatron_loop.training import distributed


def _gathered(params: list[torch.nn.Parameter]):
    """Whole parameters under ZeRO-3 (DeepSpeed partitions even an 8-element ``q``); nothing to do otherwise."""
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed  # here only: ZeRO-3 runs have it loaded already

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def gate_values(model, psi: torch.Tensor) -> dict[str, float]:
    """The timestep gates of ``model`` at the features ``psi`` [r, 8] (LoopFormer: c_l [r, d]), per loop l = 1..r."""
    values: dict[str, float] = {}
    series: dict[str, list[torch.Tensor]] = {}
    if model.loop_gating is not None:
        series["loop_gate"] = [model.loop_gating.q]
    for branch in ("attn", "mlp"):
        gates = [g for g in (getattr(b, f"{branch}_gate", None) for b in model.core) if g is not None]
        adaln = [a for a in (getattr(b, f"{branch}_adaln", None) for b in model.core) if a is not None]
        if gates:
            series[f"branch_gate_{branch}"] = [g.q for g in gates]
        if adaln:  # the modules (AdaLN, or LoopFormer's shortcut AdaLN: a bias, gate offset 0)
            series[f"adaln_scale_{branch}"] = adaln
    params = [p for ps in series.values() for x in ps for p in (x.parameters() if isinstance(x, nn.Module) else [x])]
    with _gathered(params):  # from the weights, no module call (ZeRO-3's hooks would release them)
        for name, tensors in series.items():
            if name.startswith("adaln"):  # g = offset + (W psi + b)[:d]; the mean over channels and blocks
                g = torch.stack([a.gate_offset + F.linear(psi.to(a.weight.dtype), a.weight[:a.d],
                                                          None if a.bias is None else a.bias[:a.d])
                                 for a in tensors]).float().mean(dim=(0, 2))
            else:  # g = 1 + q^T psi
                g = torch.stack([1 + psi.to(q.dtype) @ q for q in tensors]).float().mean(dim=0)
            values.update({f"{name}_l{l}": float(v) for l, v in enumerate(g.tolist(), start=1)})
    return values


def _state_statistics(trajectory: list[torch.Tensor]) -> dict[str, float]:
    """Per-token RMS of each state and relative update of each loop, averaged over the tokens."""
    norms = [h.float().norm(dim=-1) for h in trajectory]  # [b, s] each
    d = trajectory[0].shape[-1]
    values = {f"state_norm_l{l}": float(n.mean()) / d ** 0.5 for l, n in enumerate(norms)}
    for l in range(1, len(trajectory)):
        step = (trajectory[l].float() - trajectory[l - 1].float()).norm(dim=-1)
        values[f"relative_update_l{l}"] = float((step / norms[l - 1].clamp_min(1e-12)).mean())
    return values


@torch.no_grad()
def loop_dynamics(engine, model, tokens: torch.Tensor) -> dict[str, float]:
    """The numbers above for one held-out batch ``tokens`` [b, s]; ``engine`` runs the forwards
    (the DeepSpeed engine, or the model itself), ``model`` is the plain LoopLM inside it."""
    k = model.config.train_loops
    was_training = engine.training
    engine.eval()
    try:
        out = engine(tokens, num_loops=k + 1, labels=tokens, compute_logits=False, return_trajectory=True)
        values = _state_statistics(out.trajectory)
        losses = {k + 1: out.loss}
        for r in (k - 1, k):
            if r >= 1:
                losses[r] = engine(tokens, num_loops=r, labels=tokens, compute_logits=False).loss
        values.update({f"batch_loss_r{r}": float(loss) for r, loss in sorted(losses.items())})
    finally:
        engine.train(was_training)
    if model.uses_timestep:  # psi_l, or LoopFormer's c_l from its embedding (gathered under ZeRO-3)
        embedding = getattr(model, "shortcut_embedding", None)
        if embedding is None:
            psi = model.timestep_inputs(k, model.config.timestep_grid, tokens.device)
        else:
            with _gathered(list(embedding.parameters())):
                psi = timestep_inputs(model, k, model.config.timestep_grid, tokens.device, direct=True)
        values.update(gate_values(model, psi))
    return dict(zip(values, distributed.all_reduce_mean(list(values.values()))))
