"""Per-token adaptive exit at inference (issue 15 item 3), for ``LoopLM.forward``.

``num_loops`` r becomes a cap: after every loop t (t = 1..r) each token compares its output
with the previous one and *exits* once they agree to within ``exit_threshold``; an exited
token's state is frozen, so its final state is h^{t_exit} and the Coda and the head read that.

Criteria (``exit_criterion``):

``kl``
    KL(p_{t-1} || p_t) between the next-token distributions read out of successive states,
    p_t = softmax(W RMSNorm(h^t)) with p_0 read out of h^0 (Huginn's KL exit, Geiping et al.
    2025, seal-rg/recurrent-pretraining ``generate_with_adaptive_compute``, which starts from the
    uniform distribution instead). The readout skips the Coda: for BaseLoop (c = 0) p_t is exactly
    the model's prediction with r = t; with a Coda it is a "logit lens" of the state. Skipping the
    Coda keeps the decision per token -- the Coda's attention would make one token's exit depend
    on the probe states of the others, which a KV cache cannot replay.
``cosine``
    1 - cos(h^{t-1}, h^t) of successive recurrent states (no readout; the cheapest criterion).

A token exits when the distance is *strictly* below the threshold (distances are clamped at 0):
``exit_threshold = 0`` never exits (the fixed-r model, bit for bit) and a huge threshold exits
every token after its first loop (the r = 1 model). Every token runs at least one loop.

KV policy for the loops a token skipped ("latest", Huginn's ``latest-m4`` lookup): when a later
token attends at core layer k in loop t to a token that exited at loop t_e < t, it reads that
token's keys and values of core layer k from loop t_e, the last it computed. Here the policy is
applied to the keys/values of every core attention call (:meth:`TokenExit.merge`); the HF export
(``modeling_looplm.py``) applies the same rule and writes the merged keys/values into the KV cache,
so cached decoding equals cache-free decoding.

Exit decisions are not differentiable: the adaptive forward runs under ``torch.no_grad()``.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from megatron_loop.errors import LoopConfigError

EXIT_CRITERIA = ("none", "kl", "cosine")


def check_exit(criterion: str, threshold: float) -> None:
    if criterion not in EXIT_CRITERIA:
        raise LoopConfigError(f"exit_criterion={criterion!r}: expected one of {EXIT_CRITERIA}")
    if not threshold >= 0:  # also refuses NaN
        raise LoopConfigError(f"exit_threshold={threshold!r}: expected a number >= 0")


def exit_distance(criterion: str, previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Per-token distance of successive outputs ``[..., features]`` -> ``[...]`` (fp32, >= 0).

    ``kl``: inputs are log-probabilities, KL(previous || current). ``cosine``: inputs are states.
    """
    if criterion == "kl":
        d = (previous.exp() * (previous - current)).sum(-1)
    else:
        d = 1 - F.cosine_similarity(previous.float(), current.float(), dim=-1)
    return d.clamp(min=0)


class TokenExit:
    """Which tokens still loop (``active``), how many loops each ran (``loops``), and the latest
    keys/values of every core layer (the KV policy for exited tokens).

    Layout-agnostic for states (``[..., d]``); :meth:`merge` takes megatron-core's
    ``[s, b, groups, head_dim]`` keys, whose leading dims match ``LoopLM``'s ``[s, b]`` tokens.
    """

    def __init__(self, criterion: str, threshold: float, h0: torch.Tensor,
                 readout: Callable[[torch.Tensor], torch.Tensor]):
        self.criterion, self.threshold, self.readout = criterion, threshold, readout
        self.active = torch.ones(h0.shape[:-1], dtype=torch.bool, device=h0.device)
        self.loops = torch.zeros(h0.shape[:-1], dtype=torch.long, device=h0.device)
        self.previous = self._output(h0)
        self.latest: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _output(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.readout(h).float(), dim=-1) if self.criterion == "kl" else h

    def step(self, h: torch.Tensor, h_next: torch.Tensor) -> torch.Tensor:
        """After one loop: exited tokens keep ``h``; the others advance and may exit now."""
        h_next = torch.where(self.active[..., None], h_next, h)
        self.loops += self.active
        current = self._output(h_next)
        self.active &= ~(exit_distance(self.criterion, self.previous, current) < self.threshold)
        self.previous = current
        return h_next

    @property
    def done(self) -> bool:
        return not bool(self.active.any())

    def merge(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The "latest" policy at core layer ``layer``: exited tokens' keys/values are those of
        their last computed loop (every token is active in the first loop, which seeds them)."""
        if layer in self.latest:
            mask = self.active[:, :, None, None]
            key = torch.where(mask, key, self.latest[layer][0])
            value = torch.where(mask, value, self.latest[layer][1])
        self.latest[layer] = (key, value)
        return key, value

    def _pre_hook(self, layer: int, module: nn.Module, args: tuple) -> tuple:
        query, key, value = args[:3]
        return (query, *self.merge(layer, key, value), *args[3:])

    @contextmanager
    def latest_kv(self, core: nn.ModuleList):
        """Apply :meth:`merge` to the keys/values every core block's attention receives (after RoPE)."""
        handles = [block.self_attention.core_attention.register_forward_pre_hook(partial(self._pre_hook, k))
                   for k, block in enumerate(core)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
