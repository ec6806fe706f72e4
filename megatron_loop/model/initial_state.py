"""The recurrent state's initialisation: from the Prelude output (the paper) or from noise (Huginn).

``model.initial_state: prelude`` (the default) runs the recurrence from h^0 = P(e(x)) (Sec. 2.1).
``model.initial_state: noise`` is Huginn's (Geiping et al. 2025, arXiv 2502.05171, Sec. 3.1; compared
with seal-rg/recurrent-pretraining ``recpre/model_dynamic.py::RecurrentGPT.initialize_state`` and
``recpre/raven_modeling_minimal.py``): the Prelude output e = P(x) is kept as h0 and the state starts
from noise,

    s_0 ~ TruncNormal(0, sigma^2) truncated to [-3 sigma, 3 sigma],   s_i = R(e, s_{i-1}),

where R concatenates the state and e and projects them back to d dimensions before the Core (Huginn's
adapter, our ``initial_injection: dense``: ``concat(h, h0) @ W.T`` with W [d, 2d], no bias, Huginn's
``bias=False``), i.e. e is injected at every step. sigma (``model.initial_state_std``, null) is
Huginn's: its state_init "like-init" draws TruncNormal(0, sigma_e^2, +-3 sigma_e) with the embedding
std sigma_e = sqrt(2/(5d)) of its "takase" init and multiplies it by the embedding scale sqrt(d), so
sigma = sqrt(2/5) at every width (truncation at 3 sigma after the scaling). With ``dense`` injection
the adapter is initialised as Huginn's (``config.init.fn("in_proj")`` under "takase": the table's
std sqrt(2/(5d)), truncated at 3 std, no bias) instead of the paper's identity [I 0], which would make
the Core ignore the Prelude output at the start; the other injection kinds keep their initialisation.

Where the noise comes from (``LoopLM.forward``'s ``initial_state_seed``):

* a training step: an iid draw over [b, s, d] (Huginn's draw) from a generator seeded with
  :func:`step_seed` of (``train.seed``, step, micro-batch, rank) -- stateless, so a resumed run draws
  exactly the noise of every remaining step with nothing in the checkpoint (as the loop count,
  ``training/loop_sampling.py``);
* everything else (validation, export checks, the HF export): noise keyed by token position from
  ``model.initial_state_seed`` (the export's ``position_noise``): a token's s_0 depends on the seed and
  its position only, so validation is reproducible, cached decoding equals cache-free decoding and a
  one-pass loop sweep equals per-r passes. Huginn itself draws from torch's global generator at
  inference; the export does that with ``initial_state_seed=None``.

Tensor parallelism: refused (``check_tensor_parallel``): the noise would have to be the same on the
ranks of a TP group and sharded with the sequence under sequence parallelism.
"""

from __future__ import annotations

import numpy as np
import torch

from megatron_loop.config.validation import NOISE_STATE_TP_REFUSAL
from megatron_loop.errors import LoopConfigError
from megatron_loop.hf.modeling_looplm import HUGINN_STATE_STD, initial_state_noise, position_noise

# Separates this stream from every other use of (seed, step) as entropy (loop_sampling uses 0x100F).
_STREAM = 0x5EED


def state_std(config) -> float:
    """sigma of s_0: ``model.initial_state_std``, or Huginn's sqrt(2/5) when null."""
    return HUGINN_STATE_STD if config.initial_state_std is None else float(config.initial_state_std)


def step_seed(train_seed: int, step: int, micro_batch: int, rank: int) -> int:
    """The seed of one training micro-batch's s_0: a pure function of its coordinates."""
    return int(np.random.SeedSequence([_STREAM, train_seed, step, micro_batch, rank]).generate_state(1)[0])


def check_tensor_parallel(config, tp_size: int) -> None:
    if config.initial_state == "noise" and tp_size > 1:
        raise LoopConfigError(NOISE_STATE_TP_REFUSAL)


def huginn_adapter_init_(weight: torch.Tensor) -> None:
    """Huginn's adapter initialisation: W [d, 2d] ~ TruncNormal(0, 2/(5d)) truncated at 3 std."""
    std = (2 / (5 * weight.shape[0])) ** 0.5
    with torch.no_grad():
        torch.nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


def noise_state(config, h0: torch.Tensor, seed: int | None) -> torch.Tensor:
    """s_0 in the training model's layout ``[s, b, d]`` (batch-major, as the residual stream), from the
    step's ``seed`` (iid, Huginn's draw) or, when None, position-keyed from ``model.initial_state_seed``."""
    s, b, d = h0.shape
    if seed is not None:
        generator = torch.Generator(device=h0.device).manual_seed(int(seed))
        noise = initial_state_noise((b, s, d), state_std(config), generator, h0.device)
    else:
        positions = torch.arange(s, device=h0.device)[None]
        noise = position_noise(config.initial_state_seed, positions, d, config.max_position_embeddings,
                               state_std(config), torch.float32).expand(b, s, d).contiguous()
    return noise.to(h0.dtype).transpose(0, 1)
