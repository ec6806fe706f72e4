"""Ouro's learned exit gate in training: the entropy-regularised objective (Stage I) and the adaptive
gate training (Stage II) of Zhu et al. 2025, "Scaling Latent Reasoning via Looped Language Models"
(arXiv 2510.25741, Sec. 3), computed inside ``LoopLM.forward`` so that DeepSpeed, ZeRO and bf16 see
one ordinary loss.

The gate, its exit distribution and Q-exit have one implementation, in the export
(``hf/modeling_looplm.py``: ``ExitGate``, ``exit_log_distribution``, ``ExitCDF``; compared with
ByteDance's ``modeling_ouro.py``). After loop t the gate gives lambda_t = sigmoid(w^T RMSNorm(h^t) + b)
per token, and

    p(t|x) = lambda_t prod_{j<t} (1 - lambda_j)  (t < T),   p(T|x) = prod_{j<T} (1 - lambda_j),

with T the loop count of the forward (r; a sampled r under ``train.loop_sampling``).

Stage I (``train.exit_gate_objective: entropy_regularized``), per token i (the gate is per position,
as in modeling_ouro.py) and averaged over the non-ignored targets:

    L = mean_i [ sum_t p_i(t) L_i^(t) - beta H(p_i) ],   H(p) = -sum_t p(t) log p(t),

L_i^(t) the next-token cross-entropy of the prediction read out after loop t: the Coda, the final
norm and the LM head on h^t, exactly the model's prediction at r = t (what the export's
``loop_readouts`` gives). The loss is computed chunk by chunk (``loss.weighted_linear_cross_entropy``),
never with the full-vocabulary logits of the batch. -beta H is KL(p || uniform) - beta log T: Ouro's
uniform prior, up to a constant (the same gradients). Ouro uses beta = 0.1 (``train.exit_entropy_beta``).

Stage II (``train.exit_gate_objective: adaptive_gate``): the LM is frozen (every parameter but the gate's
is set ``requires_grad=False`` by :meth:`ExitObjective.prepare`; the per-step losses and the gate's
input are detached as well, so the LM receives no gradient even unfrozen), and the gate learns from the
loss improvement of each step, t = 2..T:

    I_i^(t) = max(0, L_i^(t-1) - L_i^(t)),   w_i^(t) = sigmoid(k (I_i^(t) - gamma)),
    L = mean_i mean_{t=2..T} BCE(1 - lambda_i^(t), w_i^(t))
      = mean_i mean_t -[w log(1 - lambda) + (1 - w) log lambda],

w the "continue" label, k = 50 and gamma = 0.005 in Ouro (``train.exit_gate_k``, ``train.exit_gate_gamma``).
A forward of one loop has no improvement to learn from: its Stage II loss is 0.

Both objectives are training objectives, passed with a training step's options (the ``objective`` of
:class:`~megatron_loop.model.options.LoopOptions`, :class:`megatron_loop.training.step.TrainStep`): they
replace the loss in training mode only; in eval mode
(validation, the loop dynamics) the loss stays the cross-entropy of the prediction at r, comparable
with every other model. Tensor parallelism is refused (the vocabulary-parallel head returns summed,
not per-token, losses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megatron_loop.config import TrainConfig
from megatron_loop.hf.modeling_looplm import ExitGate as _ExitGate
from megatron_loop.hf.modeling_looplm import exit_distribution, exit_log_distribution  # noqa: F401 (re-exported)
from megatron_loop.hf.modeling_looplm import check_weighted_exit, expected_logits, output_norm, state_norm
from megatron_loop.model import roles
from megatron_loop.model.loss import IGNORE_INDEX, token_linear_cross_entropy, weighted_linear_cross_entropy

ENTROPY_REGULARIZED = "entropy_regularized"  # Stage I
ADAPTIVE_GATE = "adaptive_gate"  # Stage II


class ExitGate(_ExitGate):
    """The export's ``ExitGate`` with its parameters' role (AdamW, as the conditioning parameters)."""

    def __init__(self, d: int, std: float):
        super().__init__(d, std)
        for p in self.parameters():
            roles.set_role(p, roles.CONDITIONING)


@dataclass(frozen=True)
class ExitObjective:
    """Which of Ouro's objectives the training forward computes, and its constants."""

    kind: str  # ENTROPY_REGULARIZED | ADAPTIVE_GATE
    beta: float = 0.1
    k: float = 50.0
    gamma: float = 0.005

    @classmethod
    def of(cls, train: TrainConfig) -> "ExitObjective | None":
        if train.exit_gate_objective == "none":
            return None
        return cls(train.exit_gate_objective, train.exit_entropy_beta, train.exit_gate_k, train.exit_gate_gamma)

    def prepare(self, model) -> None:
        """Before the optimizer sees ``model``: Stage II freezes every parameter but the gate's (the optimizer
        then holds the gate only: weight decay and momentum leave the LM as it is)."""
        if self.kind == ADAPTIVE_GATE:
            gate = {id(p) for p in model.exit_gate.parameters()}
            for p in model.parameters():
                if id(p) not in gate:
                    p.requires_grad_(False)

    def loss(self, model, states: list[torch.Tensor], gate_logits: list[torch.Tensor], rope,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective from the states h^1..h^T ``[s, b, d]`` and their gate logits ``[s, b]``; also the
        head input at T, ``[b, s, d]`` (what the forward's logits read)."""
        d = states[0].shape[-1]
        targets = labels[:, 1:].reshape(-1)
        weight = model.head_weight()
        if self.kind == ENTROPY_REGULARIZED:
            inputs = [step_head_input(model, h, rope) for h in states]
            logits = torch.stack(gate_logits, dim=-1).transpose(0, 1)[:, :-1].reshape(-1, len(states))
            hidden = [x[:, :-1].reshape(-1, d) for x in inputs]
            return entropy_regularized_loss(hidden, weight, targets, logits, self.beta, model.loss_chunk_tokens), \
                inputs[-1]
        with torch.no_grad():  # Stage II: the LM is frozen
            inputs = [step_head_input(model, h, rope) for h in states]
            losses = torch.stack([token_linear_cross_entropy(x[:, :-1].reshape(-1, d), weight, targets,
                                                             model.loss_chunk_tokens) for x in inputs], dim=-1)
        logits = torch.stack([model.exit_gate(state_norm(model, h).detach()) for h in states], dim=-1)
        logits = logits.transpose(0, 1)[:, :-1].reshape(-1, len(states))
        return adaptive_gate_loss(losses, logits, targets != IGNORE_INDEX, self.k, self.gamma), inputs[-1]


def step_head_input(model, h: torch.Tensor, rope) -> torch.Tensor:
    """The head input of the prediction read out after a loop: Coda, final norm, ``[b, s, d]`` -- what the
    forward at r = t reads (``LoopLM.coda_input``: Huginn's norm of h^r first, when configured)."""
    h = model.coda_input(h)
    for block in model.coda:
        h = block(h, rope)
    return model.tensor_parallel.head_input(output_norm(model, h)).transpose(0, 1)


def entropy_regularized_loss(hidden: list[torch.Tensor], weight: torch.Tensor, targets: torch.Tensor,
                             gate_logits: torch.Tensor, beta: float,
                             chunk_size: int | None = None) -> torch.Tensor:
    """Ouro's Stage I objective, mean_i [sum_t p_i(t) L_i^(t) - beta H(p_i)] over the non-ignored targets.

    ``hidden``: the head input after each loop t = 1..T, each ``[N, d]``; ``weight`` the head ``[V, d]``;
    ``targets`` ``[N]``; ``gate_logits`` ``[N, T]``. Each L^(t) weighted by p(t) is one chunked pass
    (``weighted_linear_cross_entropy``, differentiable in p as well)."""
    log_p = exit_log_distribution(gate_logits)
    p = log_p.exp()
    chunk = {} if chunk_size is None else {"chunk_size": chunk_size}
    expected = sum(weighted_linear_cross_entropy(h, weight, targets, p[:, t], **chunk) for t, h in enumerate(hidden))
    valid = (targets != IGNORE_INDEX).to(p.dtype)
    entropy = -(p * log_p).sum(-1)
    return expected - beta * (entropy * valid).sum() / valid.sum()


def adaptive_gate_loss(step_losses: torch.Tensor, gate_logits: torch.Tensor, valid: torch.Tensor, k: float,
                       gamma: float) -> torch.Tensor:
    """Ouro's Stage II gate loss from the detached per-token losses ``[N, T]`` of every loop and the gate
    logits ``[N, T]``: BCE of the continuation probability 1 - lambda^(t) against
    w^(t) = sigmoid(k (max(0, L^(t-1) - L^(t)) - gamma)), t = 2..T, averaged over t and the ``valid`` tokens."""
    if step_losses.shape[-1] < 2:  # one loop: no improvement to learn from
        return gate_logits.sum() * 0
    improvement = (step_losses[:, :-1] - step_losses[:, 1:]).clamp(min=0)
    w = torch.sigmoid(k * (improvement - gamma))
    a = gate_logits[:, 1:].to(w.dtype)
    bce = -(w * F.logsigmoid(-a) + (1 - w) * F.logsigmoid(a)).mean(-1)
    mask = valid.to(bce.dtype)
    return (bce * mask).sum() / mask.sum()


def weighted_exit_output(model, states: list[torch.Tensor], gate_logits: torch.Tensor, labels: torch.Tensor | None):
    """Ouro's weighted-exit inference on ``LoopLM`` (the export's ``expected_logits``, modeling_ouro.py:813-814):
    (logits [b, s, V] = sum_t p(t|x) head(Norm(h^t)), p(t|x) [b, s, r], the next-token cross-entropy of those
    logits when ``labels`` are given, as Ouro's loss). ``states``: h^1..h^r [s, b, d]; ``gate_logits`` [s, b, r]."""
    check_weighted_exit(model.config, True, "none")
    pdf = exit_distribution(gate_logits.transpose(0, 1))
    heads = [model.tensor_parallel.head_input(output_norm(model, h)).transpose(0, 1) for h in states]
    logits = expected_logits(lambda x: model.tensor_parallel.logits(x, model.head_weight()), heads, pdf)
    loss = None
    if labels is not None:
        shift = logits[:, :-1].float()
        loss = F.cross_entropy(shift.reshape(-1, shift.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
    return logits, pdf, loss
