"""Per-token adaptive exit at inference, for ``LoopLM.forward``.

``num_loops`` r becomes a cap: after every loop t (t = 1..r) each token compares its output
with the previous one and *exits* once they agree to within ``exit_threshold``; its final state is
h^{t_exit}, which the Coda and the head read. ``exit_mode`` says how (``modeling_looplm.TokenExit``):
``freeze`` (the default of ``kl`` / ``cosine``) stops the exited token's state and serves its last keys/values
to later tokens (the KV policy below; saves compute); ``readout`` (the default of ``q_exit``, as Ouro computes
it) runs every loop for every token and reads out each token's state of its exit loop.

Criteria (``exit_criterion``):

``kl``
    KL(p_{t-1} || p_t) between the next-token distributions read out of successive states,
    p_t = softmax(W RMSNorm(h^t)) with p_0 read out of h^0 (Huginn's KL exit, Geiping et al.
    2025, seal-rg/recurrent-pretraining ``generate_with_adaptive_compute``, which starts from the
    uniform distribution instead). The readout skips the Coda: for BaseLoop (c = 0) p_t is exactly
    the model's prediction with r = t; with a Coda it is a "logit lens" of the state. Skipping the
    Coda keeps the decision per token -- the Coda's attention would make one token's exit depend
    on the probe states of the others, which a KV cache cannot replay.
    Compared with Huginn's ``kl`` criterion (same direction, KL(p_{t-1} || p_t) summed over the
    vocabulary; exit when strictly below the threshold; r a cap): Huginn (i) reads p_t through
    ``predict_from_latents`` = final norm, Coda, final norm, head, with the Coda's KV cache;
    (ii) starts from the uniform p_0; (iii) decides per sequence on its last token while generating
    (a batch loops until every sequence exited), not per token of every forward; (iv) defaults the
    threshold to 5e-4 ("auto"; 1e-6 for its ``minp-kl`` variant, which first flattens the
    probabilities below 0.1 max p to 1/V). Its other criteria (entropy-diff, latent-diff,
    argmax-stability) are not offered here; ``cosine`` plays the role of latent-diff on the state.
``cosine``
    1 - cos(h^{t-1}, h^t) of successive recurrent states (no readout; the cheapest criterion).
``q_exit``
    Ouro's Q-exit (Zhu et al. 2025; ``model.exit_gate: learned``): exit at the first loop t whose
    cumulative exit probability CDF(t) = sum_{j<=t} p(j|x) reaches q = ``exit_threshold`` in [0, 1]
    (``modeling_looplm.ExitCDF``); the gate reads the token's own normed state, so the decision stays
    per token. Unlike the distances above, q = 0 exits every token after one loop.

A token exits (kl, cosine) when the distance is *strictly* below the threshold (distances are clamped at 0):
``exit_threshold = 0`` never exits (the fixed-r model, bit for bit) and a huge threshold exits
every token after its first loop. Every token runs at least one loop; the timestep grid stays
that of the cap r.

KV policy of the freezing exit for the loops a token skipped ("latest", Huginn's ``latest-m4`` lookup): when a later
token attends at core layer k in loop t to a token that exited at loop t_e < t, it reads that
token's keys and values of core layer k from loop t_e, the last it computed. Here the policy is
applied to the keys/values of every core attention call (:meth:`TokenExit.merge`); the HF export
(``modeling_looplm.py``) writes the merged keys/values into its KV cache, so cached decoding equals
cache-free decoding. The rule and the policy have one implementation, ``modeling_looplm.TokenExit``
(the export must stay self-contained); this module applies it to megatron-core's layouts.

Exit decisions are not differentiable: the adaptive forward runs under ``torch.no_grad()``.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from megatron_loop.errors import LoopConfigError
from megatron_loop.hf.modeling_looplm import EXIT_CRITERIA
from megatron_loop.hf.modeling_looplm import check_q_exit, exit_mode_of
from megatron_loop.hf.modeling_looplm import TokenExit as _TokenExit


def check_exit(criterion: str, threshold: float, exit_gate: str = "none", mode: str | None = None) -> None:
    if criterion not in EXIT_CRITERIA:
        raise LoopConfigError(f"exit_criterion={criterion!r}: expected one of {EXIT_CRITERIA}")
    if not threshold >= 0:  # also refuses NaN
        raise LoopConfigError(f"exit_threshold={threshold!r}: expected a number >= 0")
    try:
        check_q_exit(criterion, threshold, exit_gate)  # Ouro's Q-exit: a learned gate, q <= 1
        exit_mode_of(criterion, mode)
    except ValueError as e:
        raise LoopConfigError(str(e)) from None


class TokenExit(_TokenExit):
    """The export's ``TokenExit`` on ``LoopLM``'s layouts: tokens ``[s, b]``, megatron-core keys
    ``[s, b, groups, head_dim]``; the KV policy reaches the core attention through pre-hooks, applied for the
    loops of the forward (:meth:`applied`, which the export's ``Recurrence`` enters)."""

    def __init__(self, criterion: str, threshold: float, h0: torch.Tensor, readout, core: nn.ModuleList | None = None,
                 mode: str | None = None):
        super().__init__(criterion, threshold, h0, readout, mode)
        self.core = core  # the blocks whose attention the KV policy reaches (applied)

    def kv_mask(self) -> torch.Tensor:
        return self.active[:, :, None, None]

    def _pre_hook(self, layer: int, module: nn.Module, args: tuple) -> tuple:
        query, key, value = args[:3]
        return (query, *self.merge(layer, key, value), *args[3:])

    def applied(self):
        """The KV policy on this model's core blocks for the loops of one forward (:meth:`latest_kv`); none in
        readout mode (no token freezes)."""
        return self.latest_kv(self.core) if self.freeze else super().applied()

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
