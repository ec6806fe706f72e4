# coding=utf-8
"""LoopLM for Hugging Face transformers: one self-contained file (plain torch + transformers).

A looped language model ``p+s×K+c`` ("Prelude", "Core", "Coda"): token embedding, ``p`` Prelude
blocks, a Core of ``s`` weight-tied blocks applied ``r`` times, ``c`` Coda blocks, a final
RMSNorm and the LM head. The recurrence (paper Sec. 2.1, Eq. loop-state-evolution) is

    h^0 = P(e(x)),    h^{t+1} = F(h^t; gamma_t)  for 0 <= t < r,    y = W C(h^r).

The model was trained with ``r = K = train_loops``; ``num_loops`` (config field and
``from_pretrained`` kwarg) sets the inference loop count r, which may be smaller or larger
(extrapolation). Effective depth L(r) = p + r·s + c.

Recurrence conditioning gamma_t (paper Sec. 5 and App. C.1), in any combination:

* Initial-state injection   I_phi(h, h0)                    Eq. (initial_state_injection_variants)
* History-state injection   sum_j B_j(h_{l-j} - h_l)        Eq. (history_state_injection)
* Timestep features         psi(t, dt) in R^8               Eq. (timestep_features)
* Loop Gating (LG)          h_{l+1} = h_l + g_l (y_l - h_l) Eq. (loop_level_timestep_gating)
* Branch Gating (BG)        u+ = u + g Branch(Norm(u))      Eq. (branch_level_timestep_gating)
* AdaLN                     u+ = u + g Branch((1+s) Norm(u)) Eq. (adaln_timestep_parameters)
* LoopFormer's shortcut modulation (``timestep="shortcut"``): the same update with [g; s] = W c_l + b,
  c_l = ShortcutEmbedding(t_l, dt_l) (Jeddi et al., ICLR 2026); ``loop_steps`` runs its step schedules

One loop iteration (``LoopLMModel._loop_iteration``):

    u_l     = I_phi(h_l, h0) + sum_j B_j(h_{l-j} - h_l)
    y_l     = Core(u_l; psi_l)
    h_{l+1} = h_l + g_l (y_l - h_l) with LG,   y_l otherwise
              (u_l in place of h_l when ``loop_gating_reference == "injected"``)

Each block is a pre-norm Llama / Qwen3 decoder layer (RMSNorm, GQA self-attention with
rotate-half RoPE and optional per-head QK RMSNorm, SwiGLU MLP, no biases) running on
``torch.nn.functional.scaled_dot_product_attention``.

KV cache: a block executed several times has different keys and values at each execution, so
the cache (transformers' ``DynamicCache``) holds one layer slot per *executed block
occurrence*: slots ``0..p-1`` the Prelude, ``p + t·s + k`` Core layer k in loop t, then the
Coda. ``config.num_hidden_layers`` is this count, L(r); decoding is exact at any r.

Huginn (Geiping et al. 2025; its section below): ``block_norm="sandwich"`` (a norm after each residual sum
too), ``norm_core_output`` (the Coda reads Norm(h^r)), ``initial_state="noise"`` (the recurrence starts from
truncated-normal noise keyed by token position from ``initial_state_seed``, the Prelude output entering every
loop through the initial-state injection; ``initial_state_seed=None`` draws from torch's global generator, as
Huginn), and KV-cache sharing: ``kv_cache_loops=m`` gives the Core m loops of slots, loop t using those of
t mod m (Huginn's "compress-s"), so the cache holds p + m·s + c slots at any r.

Per-token adaptive exit (``exit_criterion`` ``kl`` | ``cosine`` with ``exit_threshold``; default
``none``): ``num_loops`` becomes a cap, and after each loop t a token whose output changed by less
than the threshold exits (``TokenExit``). How an exit acts is ``exit_mode``, two modes side by side:
``freeze`` (the default of ``kl`` / ``cosine``) stops the exited token's state and serves its last keys/values
to later tokens (the KV policy below), which saves compute; ``readout`` (the default of ``q_exit``, Ouro's)
runs every loop for every token and reads out, per token, the state of the loop it exits at. ``kl`` is KL(p_{t-1} || p_t) of the
next-token distributions read out of successive states with the final norm and the LM head
(p_0 from h^0; the Coda is skipped so the decision stays per token), ``cosine`` is
1 - cos(h^{t-1}, h^t). Threshold 0 never exits (fixed r); a huge threshold exits after one loop.
KV policy of the freezing exit for the loops a token skipped, "latest" (Huginn's): later tokens read, at Core layer k of
loop t, the exited token's keys/values of layer k from the last loop it computed. The cache slots
of skipped loops are written with exactly those keys/values, so the cache stays one rectangular
slot per block occurrence and cached decoding equals cache-free decoding. Compute is saved when
every token of a forward has exited (the remaining loops are skipped); the cache is not smaller.

Ouro's learned exit gate (``exit_gate="learned"``; Zhu et al. 2025, arXiv 2510.25741): lambda_t =
sigmoid(w^T RMSNorm(h^t) + b) after every loop (``ExitGate``), the exit distribution p(t|x) =
lambda_t prod_{j<t}(1 - lambda_j) with the remainder at r (``exit_distribution``; ``exit_pdf`` of the
outputs, [b, s, r]) and Q-exit (``exit_criterion="q_exit"``, ``exit_threshold`` q in [0, 1]): a token exits
at the first loop whose cumulative exit probability reaches q (``ExitCDF``). By default as Ouro computes it
(``exit_mode="readout"``: every loop for every token, then the per-token readout of the exit loop's state);
``exit_mode="freeze"`` freezes exited tokens under the KV policy above instead (it saves compute, but an exit
then changes the other tokens' states, logits and exits). Ouro's own norms, off by default: ``loop_norm`` (the final norm after
every loop, which the next loop, the gate and the head read; modeling_ouro.py:618) and ``block_norm="branch_output"``
(a norm on each branch's output before the residual sum; modeling_ouro.py:413-434); and its weighted-exit
inference, ``weighted_exit`` (the expected logits sum_t p(t|x) head(h^t); modeling_ouro.py:813-814).

One-pass readouts (``LoopLMForCausalLM.loop_readouts``, ``readout_loops`` of ``LoopLMModel.forward``):
where the trajectory h^1, h^2, ... does not depend on r (no timestep conditioning, or the ``prefix``
grid with r <= K; ``readout_obstacle``), one forward at r_max that runs the Coda, the final norm and
the head on h^r after loop r gives the logits of every r, each bitwise those of a forward at r: a
loop sweep r = 1..R then costs R loops instead of R(R+1)/2 (``tools/eval_loops.py`` uses it).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

# The transformers major version this file is tested with (the project's CI runs it at the locked
# version, its drift check at the oldest and the newest release that pyproject allows). An export is
# read by versions its writer never ran: loading under another major version warns once.
TESTED_TRANSFORMERS_MAJOR = 5
# The name of the KV cache argument and output field: ``past_key_values`` up to transformers 5.23,
# ``cache`` from 5.24 on (``generate`` passes ``cache=`` and reads ``outputs["cache"]``). The forward
# takes both names; outputs are built with the one the running version declares.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

INITIAL_INJECTIONS = ("none", "scalar", "channel", "residual_channel", "dense")
HISTORY_INJECTIONS = ("none", "scalar", "channel", "dense")
TIMESTEPS = ("none", "loop_gating", "branch_gating", "adaln", "shortcut")  # shortcut: LoopFormer (ShortcutEmbedding)
TIMESTEP_GRIDS = ("rescaled", "prefix")
EXIT_CRITERIA = ("none", "kl", "cosine", "q_exit")  # q_exit: Ouro, needs exit_gate="learned"
EXIT_GATES = ("none", "learned")  # Ouro's learned exit gate (ExitGate)
# How a per-token exit acts (TokenExit): "readout" runs every loop for every token and reads out, per token, the state
# of the loop it exits at (Ouro's Q-exit); "freeze" stops an exited token's state and lends its last keys/values to
# later tokens (Huginn's KV policy; what saves compute). None: the criterion's own (exit_mode_of).
EXIT_MODES = ("readout", "freeze")
LOOP_GATING_REFERENCES = ("state", "injected")
NUM_TIMESTEP_FEATURES = 8
# Huginn (Geiping et al. 2025; its section below)
BLOCK_NORMS = ("pre", "sandwich", "branch_output")  # branch_output: Ouro's norm on each branch's output
INITIAL_STATES = ("prelude", "noise")
# Huginn's state_init "like-init" under its "takase" init: TruncNormal(0, sigma_e^2, +-3 sigma_e) with the
# embedding std sigma_e = sqrt(2 / (5d)), then times the embedding scale sqrt(d): std sqrt(2/5) at every width.
HUGINN_STATE_STD = math.sqrt(2 / 5)


# ======================================================================================
# Configuration
# ======================================================================================


# Largest inference loop count r (as training's model.train_loops and train.eval_loops, config/validation.py):
# a forward at r runs L(r) = p + r s block applications per token, so num_loops=10**9 would never return.
MAX_LOOPS = 1024


def _checked_num_loops(value, where: str = "LoopLMConfig.num_loops"):
    """``num_loops`` as an int in [1, MAX_LOOPS], or None (= K). Floats, strings and bools are refused rather
    than truncated or parsed: r = 2.5 or "3" is a typo, not a loop count."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{where}={value!r}: expected an integer >= 1 (the inference loop "
                         "count r), or None for the training loop count K")
    if value > MAX_LOOPS:
        raise ValueError(f"{where}={value!r}: expected at most {MAX_LOOPS} (a forward at r runs L(r) = p + r s "
                         "block applications per token)")
    return int(value)


def _checked_call(config, input_ids, cached: bool, num_loops, timestep_grid, exit_criterion, exit_threshold,
                  exit_mode=None, weighted_exit=None):
    """The arguments of one forward (``generate()`` passes its own to every forward): every per-call override
    checked as the config checks its field, and token ids inside the vocabulary (an id >= vocab_size was a
    bare IndexError on CPU and a device-side assert on CUDA). ``cached``: a decoding step on a filled KV cache,
    whose ids the model produced (not checked again: a host sync per token). Returns (num_loops, criterion,
    threshold, exit mode) in effect."""
    num_loops = _checked_num_loops(num_loops, "num_loops")
    if timestep_grid is not None and timestep_grid not in TIMESTEP_GRIDS:
        raise ValueError(f"timestep_grid={timestep_grid!r}: expected one of {TIMESTEP_GRIDS}")
    criterion = config.exit_criterion if exit_criterion is None else exit_criterion
    threshold = config.exit_threshold if exit_threshold is None else exit_threshold
    if criterion not in EXIT_CRITERIA:
        raise ValueError(f"exit_criterion={criterion!r}: expected one of {EXIT_CRITERIA}")
    _check_exit_threshold(threshold)
    check_q_exit(criterion, threshold, getattr(config, "exit_gate", "none"))
    mode = exit_mode_of(criterion, getattr(config, "exit_mode", None) if exit_mode is None else exit_mode)
    check_weighted_exit(config, getattr(config, "weighted_exit", False) if weighted_exit is None else weighted_exit,
                        criterion)
    if input_ids is not None:
        if (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype == torch.bool
                or input_ids.is_floating_point() or input_ids.is_complex() or input_ids.shape[1] == 0):
            got = (f"a {input_ids.dtype} tensor of shape {list(input_ids.shape)}" if isinstance(input_ids, torch.Tensor)
                   else type(input_ids).__name__)
            raise ValueError(f"input_ids: {got}; expected an integer tensor of token ids [batch, sequence] with at "
                             "least one token")
        if not cached and input_ids.numel():
            low, high = torch.aminmax(input_ids)
            if low < 0 or high >= config.vocab_size:
                bad = int(low) if low < 0 else int(high)
                raise ValueError(f"input_ids: token id {bad} is outside the vocabulary (vocab_size="
                                 f"{config.vocab_size}); expected ids in [0, {config.vocab_size - 1}] from the "
                                 "tokenizer the model was trained with")
    return num_loops, criterion, threshold, mode


# The numeric fields of the config: (smallest, largest or None, integer?) -> checked on every assignment (a size
# of another type or sign failed deep inside torch; history_window=10**9 allocated a 4 GB beta)
CONFIG_NUMBERS = {
    **{key: (0, None, True) for key in ("prelude_layers", "coda_layers")},
    **{key: (1, None, True) for key in ("core_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")},
    # beta holds one entry per lag j = 1..w (Eq. history_state_injection): w = 0 has none
    **{key: (1, MAX_LOOPS, True) for key in ("train_loops", "history_window")},
    **{key: (0, None, False) for key in ("rms_norm_eps", "initializer_range")},
}


def _check_number(key: str, value) -> None:
    low, high, integer = CONFIG_NUMBERS[key]
    kind = numbers.Integral if integer else numbers.Real
    if (isinstance(value, bool) or not isinstance(value, kind) or not (low < value < math.inf if not integer else
                                                                     low <= value <= (high or math.inf))):
        expected = (f"an integer from {low} to {high}" if high else f"an integer >= {low}") if integer else \
            "a positive finite number"
        what = " (the number of past states the history injection reads)" if key == "history_window" else ""
        raise ValueError(f"LoopLMConfig.{key}={value!r}: expected {expected}{what}")


def _check_prefix_grid(num_loops, train_loops, timestep, grid) -> None:
    """The ``prefix`` grid is the training grid T = K, so it has no timestep for r > K (App. C.1)."""
    if (grid == "prefix" and timestep not in (None, "none") and num_loops is not None and train_loops is not None
            and num_loops > train_loops):
        raise ValueError(f"LoopLMConfig.timestep_grid='prefix' with num_loops={num_loops}: the prefix grid is the "
                         f"training grid of train_loops={train_loops} steps, so r must be <= {train_loops}; use "
                         "timestep_grid='rescaled' to extrapolate")


class LoopLMConfig(PretrainedConfig):
    """Configuration of a LoopLM ``p+s×K+c`` (names fixed by the export contract).

    ``num_loops`` is the inference loop count r (``None``: the training count K); it can be
    set as a ``from_pretrained`` kwarg or changed on a loaded model (``model.config.num_loops``).
    ``timestep_grid`` picks the timestep grid at inference: ``rescaled`` (T = r, any r) or
    ``prefix`` (T = K, the first r steps, r <= K). ``exit_criterion`` (``none`` | ``kl`` | ``cosine``)
    and ``exit_threshold`` turn on per-token adaptive exit with r as the cap (absent from exports
    written before they existed: the defaults, no exit).
    """

    model_type = "looplm"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        prelude_layers: int = 0,
        core_layers: int = 4,
        train_loops: int = 1,
        coda_layers: int = 0,
        num_loops: int | None = None,
        hidden_size: int = 64,
        intermediate_size: int = 160,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 16,
        vocab_size: int = 2048,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 4096,
        qk_norm: bool = False,
        initial_injection: str = "none",
        history_injection: str = "none",
        history_window: int = 1,
        timestep: str = "none",
        timestep_grid: str = "rescaled",
        exit_criterion: str = "none",
        exit_threshold: float = 0.0,
        loop_gating_reference: str = "state",
        block_norm: str = "pre",
        norm_core_output: bool = False,
        initial_state: str = "prelude",
        initial_state_std: float = HUGINN_STATE_STD,
        initial_state_seed: int | None = 0,
        kv_cache_loops: int | None = None,
        exit_gate: str = "none",
        exit_mode: str | None = None,
        loop_norm: bool = False,
        weighted_exit: bool = False,
        initializer_range: float = 0.02,
        hidden_act: str = "silu",
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        **kwargs,
    ):
        self.prelude_layers = prelude_layers
        self.core_layers = core_layers
        self.train_loops = train_loops
        self.coda_layers = coda_layers
        self.num_loops = num_loops
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.vocab_size = vocab_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = dict(rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
        self.max_position_embeddings = max_position_embeddings
        self.qk_norm = qk_norm
        self.initial_injection = initial_injection
        self.history_injection = history_injection
        self.history_window = history_window
        self.timestep = timestep
        self.timestep_grid = timestep_grid
        self.exit_criterion = exit_criterion
        self.exit_threshold = exit_threshold
        # What Loop Gating mixes with the core output: the state h_l ("state"; exports written
        # before this field existed) or the injected core input u_l ("injected").
        self.loop_gating_reference = loop_gating_reference
        # Huginn (Geiping et al. 2025; absent from exports written before they existed: these defaults):
        # sandwich blocks, the final norm on h^r before the Coda, the recurrent state drawn from noise
        # (position-keyed from initial_state_seed; None: torch's global generator), KV-cache sharing.
        self.block_norm = block_norm
        self.norm_core_output = norm_core_output
        self.initial_state = initial_state
        self.initial_state_std = initial_state_std
        self.initial_state_seed = initial_state_seed
        self.kv_cache_loops = kv_cache_loops
        # Ouro's learned exit gate (``ExitGate``; absent from exports written before it existed: none)
        self.exit_gate = exit_gate
        # How the per-token exit acts (EXIT_MODES; None, and exports written before it existed: the criterion's own,
        # readout for q_exit, freeze for kl / cosine)
        self.exit_mode = exit_mode
        # Ouro (absent from exports written before they existed: off): the final norm after every loop
        # (``loop_norm``, modeling_ouro.py:618) and the expected logits over the exit distribution
        # (``weighted_exit``, modeling_ouro.py:813-814; ``expected_logits``)
        self.loop_norm = loop_norm
        self.weighted_exit = weighted_exit
        self.initializer_range = initializer_range
        self.hidden_act = hidden_act
        self.use_cache = use_cache
        self.tie_word_embeddings = tie_word_embeddings
        self._check()
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def __setattr__(self, key, value):
        # Checked on every assignment, not only in __init__: ``from_pretrained(..., num_loops=R)``,
        # lm-eval's ``--model_args num_loops=R`` and ``model.config.num_loops = R`` all set the
        # attribute on a built config, where a bad value would otherwise surface as a wrong model.
        if key == "num_loops":
            value = _checked_num_loops(value)
        elif key in CONFIG_NUMBERS:  # also from_pretrained's kwargs, which transformers sets after __init__
            _check_number(key, value)
        elif key == "timestep_grid" and value not in TIMESTEP_GRIDS:
            raise ValueError(f"LoopLMConfig.timestep_grid={value!r}: expected one of {TIMESTEP_GRIDS}")
        elif key == "exit_criterion" and value not in EXIT_CRITERIA:
            raise ValueError(f"LoopLMConfig.exit_criterion={value!r}: expected one of {EXIT_CRITERIA}")
        elif key == "exit_threshold":
            _check_exit_threshold(value)
        elif key == "exit_mode":
            _check_exit_mode(value)
        elif key == "kv_cache_loops":
            _check_kv_cache_loops(value)
        if key in ("num_loops", "timestep_grid", "timestep"):
            fields = {**self.__dict__, key: value}
            _check_prefix_grid(fields.get("num_loops"), fields.get("train_loops"), fields.get("timestep"),
                               fields.get("timestep_grid"))
        super().__setattr__(key, value)

    def _check(self) -> None:
        choices = {"initial_injection": INITIAL_INJECTIONS, "history_injection": HISTORY_INJECTIONS,
                   "timestep": TIMESTEPS, "timestep_grid": TIMESTEP_GRIDS,
                   "loop_gating_reference": LOOP_GATING_REFERENCES, "exit_criterion": EXIT_CRITERIA,
                   "exit_gate": EXIT_GATES}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"LoopLMConfig.{key}={getattr(self, key)!r}: expected one of {allowed}")
        _check_exit_threshold(self.exit_threshold)
        _check_exit_mode(self.exit_mode)
        _check_huginn(self)
        check_q_exit(self.exit_criterion, self.exit_threshold, self.exit_gate)
        check_weighted_exit(self, self.weighted_exit, self.exit_criterion)
        if not isinstance(self.loop_norm, bool):
            raise ValueError(f"LoopLMConfig.loop_norm={self.loop_norm!r}: expected True or False (Ouro's between-loop norm)")
        if self.hidden_act != "silu":
            raise ValueError(f"LoopLMConfig.hidden_act={self.hidden_act!r}: only 'silu' (SwiGLU) is supported")

    @property
    def loops(self) -> int:
        """The inference loop count r in effect (``num_loops``, or K when unset)."""
        return self.train_loops if self.num_loops is None else int(self.num_loops)

    def effective_depth(self, num_loops: int | None = None) -> int:
        """L(r) = p + r·s + c."""
        r = self.loops if num_loops is None else int(num_loops)
        return self.prelude_layers + r * self.core_layers + self.coda_layers

    def kv_cache_slots(self, num_loops: int | None = None) -> int:
        """KV-cache slots of a forward at r: one per executed block occurrence, L(r), or p + m·s + c
        with KV-cache sharing over a budget of m loops (``kv_cache_loops``, Huginn)."""
        r = self.loops if num_loops is None else int(num_loops)
        return self.prelude_layers + kv_cache_loops(self, r) * self.core_layers + self.coda_layers

    @property
    def num_hidden_layers(self) -> int:
        """KV-cache slots (what ``DynamicCache(config=...)`` sizes): L(r) = executed block occurrences,
        fewer with ``kv_cache_loops``."""
        return self.kv_cache_slots()


def _check_exit_threshold(threshold) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"exit_threshold={threshold!r}: expected a number >= 0 (0: never exit)")


def _check_exit_mode(mode) -> None:
    if mode is not None and mode not in EXIT_MODES:
        raise ValueError(f"exit_mode={mode!r}: expected one of {EXIT_MODES}, or None (the criterion's own: readout "
                         "for q_exit, freeze for kl and cosine)")


def exit_mode_of(criterion: str, mode: str | None) -> str:
    """The exit mode in effect (:class:`TokenExit`): ``mode``, or when None the criterion's own -- ``readout`` for
    Ouro's Q-exit (as Ouro computes it), ``freeze`` for the ``kl`` / ``cosine`` distances (Huginn's exit)."""
    _check_exit_mode(mode)
    return mode if mode is not None else ("readout" if criterion == "q_exit" else "freeze")


_warned_versions: set[tuple[str, str]] = set()


def _warn_if_untested_transformers(config: PretrainedConfig) -> None:
    """Warn once per (written, running) pair when the running transformers is not the major version
    this file is tested with. ``config.transformers_version`` is the version that wrote the export."""
    running = transformers.__version__
    written = str(getattr(config, "transformers_version", None) or "unknown")
    if running.split(".")[0] == str(TESTED_TRANSFORMERS_MAJOR) or (written, running) in _warned_versions:
        return
    _warned_versions.add((written, running))
    warnings.warn(f"LoopLM export written with transformers {written}, loaded under transformers {running}: "
                  f"its modeling file is tested with transformers {TESTED_TRANSFORMERS_MAJOR}.x only; check "
                  "cached generation against cache-free decoding before trusting its outputs", stacklevel=3)


def _take_cache(past_key_values: Cache | None, kwargs: dict) -> Cache | None:
    """The KV cache, under whichever name the caller used (``past_key_values`` or ``cache``).

    A cache passed under a name this file does not know would otherwise land in ``**kwargs`` and be
    ignored, and every decoding step would silently run without its context: refuse it instead."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("LoopLM forward got two different KV caches, as cache and as past_key_values; pass one")
    unknown = [k for k, v in kwargs.items() if isinstance(v, Cache)]
    if unknown:
        raise TypeError(f"LoopLM forward got a KV cache as {unknown[0]!r}, an argument it does not read; "
                        "pass it as cache (transformers >= 5.24) or past_key_values")
    return past_key_values if past_key_values is not None else cache


# ======================================================================================
# Building blocks: RMSNorm, rotary embedding, attention, SwiGLU MLP
# ======================================================================================


class LoopLMRMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def rope_inverse_frequencies(config: LoopLMConfig, device: torch.device | None = None) -> torch.Tensor:
    """Inverse rotary frequencies [head_dim / 2]; ``rope_type`` ``default`` or ``llama3``.

    Llama 3 rule: wavelengths longer than original_context / low_freq_factor are divided by
    ``factor``, shorter than original_context / high_freq_factor kept, smoothly interpolated
    in between.
    """
    rope = config.rope_parameters
    dim = config.head_dim
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"rope_parameters.rope_type={kind!r}: expected 'default' or 'llama3'")
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_ctx = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(is_medium, smoothed, scaled)


class LoopLMRotaryEmbedding(nn.Module):
    """cos/sin tables [b, s, head_dim] for given position ids (rotate-half convention).

    The frequencies are recomputed on the input's device each call (head_dim / 2 numbers), so
    there is no buffer to initialise or move.
    """

    def __init__(self, config: LoopLMConfig):
        super().__init__()
        self.config = config

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = rope_inverse_frequencies(self.config, position_ids.device)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, s, d]; cos/sin [b, s, d]."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


class LoopLMAttention(nn.Module):
    """Causal grouped-query self-attention (SDPA) with RoPE and optional QK-norm (Qwen3).

    ``slot`` is this execution's KV-cache layer index (one per executed block occurrence).
    """

    def __init__(self, config: LoopLMConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=False)
        if config.qk_norm:
            self.q_norm = LoopLMRMSNorm(hd, config.rms_norm_eps)
            self.k_norm = LoopLMRMSNorm(hd, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                cache: Cache | None, slot: int, kv_merge=None) -> torch.Tensor:
        """``kv_merge``: the adaptive-exit KV policy (``TokenExit.merge`` of this Core layer), applied
        to the new keys/values before they are cached and attended to."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, s, d]
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if kv_merge is not None:
            k, v = kv_merge(k, v)
        if cache is not None:
            k, v = cache.update(k, v, slot)
        gqa = self.num_kv_heads != self.num_heads
        if mask is None:  # plain causal attention, nothing cached before (or a single new token)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1 and k.shape[2] == s, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


class LoopLMMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LoopLMConfig):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ======================================================================================
# Recurrence conditioning (paper Sec. 5)
# ======================================================================================


def timestep_features(num_loops: int, train_loops: int, grid: str, device=None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """psi(t_l, dt) for l = 0..r-1, shape [r, 8], Eq. (timestep_features):

        psi(t, dt) = (t, dt, t^2, dt^2, t dt, sin(pi t), cos(pi t) - 1, sin(2 pi t)),
        t_l = l / T, dt = 1 / T;  training T = K; ``rescaled`` T = r; ``prefix`` T = K, r <= K
        (App. C.1). The training model uses this function too (``megatron_loop/model/conditioning.py``).
    """
    return psi_features(*timestep_times(num_loops, train_loops, grid))[:num_loops].to(device=device, dtype=dtype)


def timestep_times(num_loops: int, train_loops: int, grid: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_l, dt_l) for l = 0..T-1, float64 on the host: the grids of App. C.1 (t_l = l / T, dt = 1 / T;
    ``rescaled`` T = r, ``prefix`` T = K with r <= K), shared by psi (:func:`timestep_features`) and
    LoopFormer's shortcut modulation (:class:`ShortcutEmbedding`, where the rescaled grid is its
    uniform inference schedule of budget r). Loop l reads row l; callers compute their features over
    the whole horizon and keep the first r rows, so that the prefix grid's features of loop l are the
    same computation (bitwise) whatever r is, which one-pass readouts (``LoopLMModel.forward``'s
    ``readout_loops``) rely on (a vectorised sin or matmul may round a row differently in a shorter
    tensor); rescaled has T = r, so nothing changes there."""
    if num_loops < 1:
        raise ValueError(f"num_loops={num_loops}: expected an integer >= 1")
    if grid == "rescaled":
        horizon = num_loops
    elif grid == "prefix":
        if num_loops > train_loops:
            raise ValueError(f"timestep_grid='prefix' with num_loops={num_loops}: the prefix grid keeps T = "
                             f"train_loops = {train_loops} and needs num_loops <= {train_loops}; use "
                             "timestep_grid='rescaled' to extrapolate")
        horizon = train_loops
    else:
        raise ValueError(f"timestep_grid={grid!r}: expected one of {TIMESTEP_GRIDS}")
    t = torch.arange(horizon, dtype=torch.float64) / horizon
    return t, torch.full_like(t, 1.0 / horizon)


def psi_features(t: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """psi(t, dt) [r, 8] of Eq. (timestep_features) at given times and step sizes (float64 in, float64 out)."""
    return torch.stack([t, dt, t * t, dt * dt, t * dt, torch.sin(math.pi * t),
                        torch.cos(math.pi * t) - 1, torch.sin(2 * math.pi * t)], dim=-1)


def readout_obstacle(config: LoopLMConfig, loops, timestep_grid: str | None = None) -> str | None:
    """Why one forward at r_max = max(loops) cannot give the logits of every r in ``loops``
    (None when it can: ``LoopLMForCausalLM.loop_readouts``).

    forward(num_loops=r) reads coda + head from h^r. The trajectory h^0, h^1, ... depends on r only
    through psi_l (Eq. timestep_features): the initial-state and history injections read h^0 and
    past states only (Eqs. initial_state_injection_variants, history_state_injection), and adaptive
    exit decides from successive states, with r a cap. So h^r of the run at r is h^r of the run at
    r_max exactly when psi_0..psi_{r-1} do not depend on r: always without timestep conditioning;
    on the ``prefix`` grid (t_l = l / K, App. C.1) for r <= K; never on the ``rescaled`` grid with
    two loop counts (t_l = l / r, dt = 1 / r for Loop Gating, Branch Gating, AdaLN and LoopFormer's
    shortcut modulation alike).
    """
    loops = sorted({int(r) for r in loops})
    grid = timestep_grid or config.timestep_grid
    if len(loops) >= 2 and huginn_readout_obstacle(config) is not None:
        return huginn_readout_obstacle(config)
    if config.timestep == "none" or len(loops) < 2:
        return None
    if grid == "prefix":
        if loops[-1] > config.train_loops:
            return (f"the prefix timestep grid has no step for r = {loops[-1]} > K = {config.train_loops} "
                    "(App. C.1)")
        return None
    return (f"timestep conditioning ({config.timestep}) on the rescaled grid: t_l = l/r and dt = 1/r depend on r "
            "(Eq. timestep_features, App. C.1), so each r has its own trajectory")


def history_window(completed: list[torch.Tensor], window: int) -> list[torch.Tensor]:
    """The states h_{l-1}, ..., h_{l-m_l} the history injection reads for the transition h_l -> h_{l+1},
    m_l = min(w, max(l - 1, 0)), Eq. (history_state_injection). ``completed`` is [h_1, ..., h_l] (every
    recurrent state so far, h0 excluded); its last element, the current state, is not in the window."""
    return completed[:-1][::-1][:window]


class InitialStateInjection(nn.Module):
    """I_phi(h, h0) before every execution of the Core, Eq. (initial_state_injection_variants):

        scalar            h + alpha h0                   alpha [1]
        channel           a * h + b * h0                 a, b [d]
        residual_channel  (1 + delta_a) * h + b * h0     delta_a, b [d]
        dense             concat(h, h0) @ weight.T       weight [d, 2d]
    """

    def __init__(self, kind: str, d: int):
        super().__init__()
        self.kind = kind
        if kind == "scalar":
            self.alpha = nn.Parameter(torch.zeros(1))
        elif kind == "channel":
            self.a, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        elif kind == "residual_channel":
            self.delta_a, self.b = nn.Parameter(torch.zeros(d)), nn.Parameter(torch.zeros(d))
        else:  # dense, identity on h at initialisation
            self.weight = nn.Parameter(torch.cat([torch.eye(d), torch.zeros(d, d)], dim=1))

    def forward(self, h: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        if self.kind == "scalar":
            return h + self.alpha * h0
        if self.kind == "channel":
            return self.a * h + self.b * h0
        if self.kind == "residual_channel":
            return (1 + self.delta_a) * h + self.b * h0
        return torch.cat([h, h0], dim=-1) @ self.weight.t()


class HistoryStateInjection(nn.Module):
    """sum_{j=1}^{m_l} B_j(h_{l-j} - h_l), Eq. (history_state_injection), m_l = min(w, max(l-1, 0)).

    ``beta`` [w] scalar | [w, d] channel | [w, d, d] dense; lag j uses ``beta[j-1]`` (dense as
    ``diff @ beta[j-1].T``). The window holds completed states h_1..h_{l-1}, never h0.
    """

    def __init__(self, kind: str, d: int, window: int):
        super().__init__()
        self.kind = kind
        shape = {"scalar": (window,), "channel": (window, d), "dense": (window, d, d)}[kind]
        self.beta = nn.Parameter(torch.zeros(shape))

    def forward(self, h: torch.Tensor, past: list[torch.Tensor]) -> torch.Tensor:
        total = torch.zeros_like(h)
        for j, h_lag in enumerate(past, start=1):
            diff = h_lag - h
            beta = self.beta[j - 1]
            total = total + (diff @ beta.t() if self.kind == "dense" else beta * diff)
        return total


class LoopGating(nn.Module):
    """Loop Gating, Eq. (loop_level_timestep_gating): g_l = 1 + q^T psi_l, h_{l+1} = x_l + g_l (y_l - x_l),
    with reference x_l = h_l (``loop_gating_reference="state"``) or the injected core input u_l."""

    def __init__(self):
        super().__init__()
        self.q = nn.Parameter(torch.zeros(NUM_TIMESTEP_FEATURES))

    def forward(self, h: torch.Tensor, y: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
        g = 1 + psi.to(self.q.dtype) @ self.q
        return h + g.to(h.dtype) * (y - h)


class BranchGating(nn.Module):
    """Branch Gating of one residual branch, Eq. (branch_level_timestep_gating): g = 1 + q^T psi_l, s = 0."""

    def __init__(self):
        super().__init__()
        self.q = nn.Parameter(torch.zeros(NUM_TIMESTEP_FEATURES))

    def forward(self, psi: torch.Tensor) -> tuple[torch.Tensor, None]:
        return 1 + psi.to(self.q.dtype) @ self.q, None


class AdaLN(nn.Module):
    """AdaLN of one residual branch, Eq. (adaln_timestep_parameters): [g - 1; s] = W psi_l, W [2d, 8].

    Parametrised (:func:`adaln_arguments`) it is also LoopFormer's shortcut modulation of the branch,
    [g; s] = W c_l + b with W [2d, d] and c_l = :class:`ShortcutEmbedding` (t_l, dt_l): ``features`` is
    the width of the conditioning input, ``bias`` adds b, and the gate is ``gate_offset`` + its rows
    (1 here, 0 in LoopFormer, whose gate is the raw output)."""

    def __init__(self, d: int, features: int = NUM_TIMESTEP_FEATURES, bias: bool = False, gate_offset: float = 1.0):
        super().__init__()
        self.d = d
        self.gate_offset = gate_offset
        self.weight = nn.Parameter(torch.zeros(2 * d, features))
        self.bias = nn.Parameter(torch.zeros(2 * d)) if bias else None

    def forward(self, psi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.weight @ psi.to(self.weight.dtype)
        if self.bias is not None:
            out = out + self.bias
        return self.gate_offset + out[: self.d], out[self.d:]


# ======================================================================================
# ---- LoopFormer (Jeddi et al., ICLR 2026): shortcut modulation on (t, dt) ----
# ======================================================================================
# "LoopFormer: Elastic-Depth Looped Transformers for Latent Reasoning via Shortcut Modulation";
# compared with armenjeddi/loopformer models/loopformer.py (TimestepEmbedder, LoopFormerBlock,
# GPT.forward). Training (variable-length trajectories, shortcut consistency) is in the training
# stack (megatron_loop/model/shortcut.py); the export runs budget r on the uniform schedule dt = 1/r.

SHORTCUT_FREQUENCIES = 256  # LoopFormer's frequency_embedding_size
SHORTCUT_MAX_PERIOD = 10000.0


def sinusoidal_embedding(x: torch.Tensor, dim: int = SHORTCUT_FREQUENCIES,
                         max_period: float = SHORTCUT_MAX_PERIOD) -> torch.Tensor:
    """[cos(x f_j); sin(x f_j)] [n, dim] in fp32, f_j = max_period^(-j / (dim/2)), j < dim/2 (DiT's and
    LoopFormer's ``TimestepEmbedder.timestep_embedding``, cos first; dim even)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=x.device) / half)
    args = x.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ShortcutEmbedding(nn.Module):
    """LoopFormer's conditioning of loop l on its normalised time t_l and step size dt_l:

        c_l = SiLU(E_t(t_l) + E_dt(dt_l)),   E(x) = W2 SiLU(W1 sinusoid_256(x) + b1) + b2,

    W1 [d, 256], W2 [d, d] per embedder. t_l is the time reached before the step (t_0 = 0) and
    dt_l = t_{l+1} - t_l; a trajectory sums to 1. Each core branch maps c_l to its gate and scale
    with an :class:`AdaLN` of ``adaln_arguments("shortcut", d)``: u+ = u + g Branch((1 + s) Norm(u)),
    Eq. (branch_timestep_modulation) with LoopFormer's [g; s] = W c_l + b (its ``adaLN_modulation``
    = SiLU then Linear(d, 4d) per block; the SiLU, the same for every block, is applied here once).
    2 (256 d + d^2 + 2 d) parameters, and 4 d^2 + 4 d per core layer."""

    def __init__(self, d: int, frequencies: int = SHORTCUT_FREQUENCIES):
        super().__init__()
        self.frequencies = frequencies
        self.time_embedder = nn.Sequential(nn.Linear(frequencies, d), nn.SiLU(), nn.Linear(d, d))
        self.step_embedder = nn.Sequential(nn.Linear(frequencies, d), nn.SiLU(), nn.Linear(d, d))

    def forward(self, t: torch.Tensor, dt: torch.Tensor, direct: bool = False) -> torch.Tensor:
        """c_l [n, d] for times ``t`` and step sizes ``dt`` [n] (float64 or fp32). ``direct``: apply the
        embedders' weights without calling them as modules (the training stack's loop dynamics read c_l
        outside a forward, from weights ZeRO-3 gathered; a module call would run its hooks)."""
        dtype = self.time_embedder[0].weight.dtype

        def embed(mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
            z = sinusoidal_embedding(x, self.frequencies).to(dtype)
            if not direct:
                return mlp(z)
            return F.linear(F.silu(F.linear(z, mlp[0].weight, mlp[0].bias)), mlp[2].weight, mlp[2].bias)

        return F.silu(embed(self.time_embedder, t) + embed(self.step_embedder, dt))


def adaln_arguments(timestep: str, d: int) -> dict:
    """The :class:`AdaLN` parametrisation of ``timestep``: this paper's (Eq. adaln_timestep_parameters,
    psi in R^8, g = 1 + ..., no bias) or LoopFormer's shortcut modulation (c_l in R^d, bias, g = raw
    output: a branch starts near zero, as LoopFormer's)."""
    if timestep == "shortcut":
        return dict(features=d, bias=True, gate_offset=0.0)
    return {}


def trajectory_times(steps, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_l, dt_l) float64 of a trajectory of step sizes dt_l = n_l / H (``steps`` n_l: positive integers
    summing to ``horizon`` H), t_l = (n_0 + ... + n_{l-1}) / H. LoopFormer's schedules: the full one
    [1/K] * K (= the rescaled grid of r = K, bitwise), and the short ones of its training
    (``utils.sample_short_trajectory``: step sizes in multiples of 1/K)."""
    n = [int(x) for x in steps]
    if not n or any(x < 1 for x in n) or sum(n) != horizon:
        raise ValueError(f"loop_steps={list(steps)!r}: expected positive integers summing to {horizon} (step sizes "
                         f"in units of 1/{horizon}, a trajectory from t = 0 to 1)")
    units = torch.tensor(n, dtype=torch.float64)
    return (torch.cumsum(units, 0) - units) / horizon, units / horizon


# ======================================================================================
# Per-token adaptive exit and the "latest" KV policy
# ======================================================================================


def exit_distance(criterion: str, previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Per-token distance of successive loop outputs (fp32, clamped at 0): ``kl`` takes
    log-probabilities, KL(previous || current); ``cosine`` takes states, 1 - cos."""
    if criterion == "kl":
        d = (previous.exp() * (previous - current)).sum(-1)
    else:
        d = 1 - F.cosine_similarity(previous.float(), current.float(), dim=-1)
    return d.clamp(min=0)


class TokenExit:
    """State of one adaptive forward: ``active`` [b, s] (tokens that have not exited), ``loops`` [b, s] (the
    loop each token exits at: the loops it ran when frozen, the loop whose state is read out otherwise) and,
    when freezing, the latest keys/values of every Core layer.

    ``readout`` maps states to logits (final norm + LM head) for the ``kl`` criterion, to the exit
    gate's logit for ``q_exit`` (Ouro's Q-exit, ``ExitCDF``).

    ``mode`` (:data:`EXIT_MODES`, :func:`exit_mode_of`) is how an exit acts, the two side by side:

    * ``readout`` -- Ouro's Q-exit as Ouro computes it (ByteDance's modeling_ouro.py, OuroForCausalLM.forward,
      lines 792-812 of the Ouro-1.4B file: ``exit_steps = argmax(cumsum(pdf) >= q)``, the last step where never
      reached, then ``gather(stack(hidden_states_list), exit_steps)``): every token runs every loop, so no token's
      exit changes another token's state, its logits or its decision; each token's final state is the state of
      the loop it exits at (:meth:`final`). No compute is saved; the KV cache is the fixed-r model's.
    * ``freeze`` -- an exited token's state stops (its later states stay h^{t_exit}) and later tokens read its
      last keys/values (the "latest" KV policy, Huginn's): the other tokens' states, logits and exit decisions
      then depend on who exited, and when every token of a forward has exited the remaining loops are skipped.
    """

    def __init__(self, criterion: str, threshold: float, h0: torch.Tensor, readout, mode: str = "freeze"):
        self.criterion, self.threshold, self.readout = criterion, threshold, readout
        self.freeze = exit_mode_of(criterion, mode) == "freeze"
        self.active = torch.ones(h0.shape[:-1], dtype=torch.bool, device=h0.device)
        self.loops = torch.zeros(h0.shape[:-1], dtype=torch.long, device=h0.device)
        # q_exit (Ouro): ``readout`` is the exit gate's logit, accumulated into CDF(t) (``ExitCDF``)
        self.cdf = ExitCDF(h0.shape[:-1], h0.device) if criterion == "q_exit" else None
        self.previous = None if self.cdf is not None else self._output(h0)
        self.latest: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.chosen = None if self.freeze else h0  # readout: the state of the loop each exited token exits at

    def _output(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.readout(h).float(), dim=-1) if self.criterion == "kl" else h

    def _exits(self, h_next: torch.Tensor) -> torch.Tensor:
        """Which tokens' exit condition holds after this loop (for every token; the caller masks)."""
        if self.cdf is not None:  # Q-exit: CDF(t) >= q
            return self.cdf.update(self.readout(h_next)) >= self.threshold
        current = self._output(h_next)
        exits = exit_distance(self.criterion, self.previous, current) < self.threshold
        self.previous = current
        return exits

    def step(self, h: torch.Tensor, h_next: torch.Tensor) -> torch.Tensor:
        """After one loop: the next state of every token (freezing: exited tokens keep ``h``); tokens whose
        condition holds exit."""
        if self.freeze:
            h_next = torch.where(self.active[..., None], h_next, h)
        self.loops += self.active
        exiting = self.active & self._exits(h_next)
        if not self.freeze:
            self.chosen = torch.where(exiting[..., None], h_next, self.chosen)
        self.active &= ~exiting
        return h_next

    def final(self, h: torch.Tensor) -> torch.Tensor:
        """The state read out of each token after the loops so far: ``h`` when freezing (exited tokens' states
        stopped there); in readout mode the state of the loop each token exited at, ``h`` for the others."""
        return h if self.freeze else torch.where(self.active[..., None], h, self.chosen)

    @property
    def done(self) -> bool:
        """Every token exited and froze: the remaining loops would change nothing (readout mode runs them all,
        as Ouro: a later token attends to every token's keys/values of every loop)."""
        return self.freeze and not bool(self.active.any())

    def applied(self):
        """A context around the loops of the forward: nothing here (this file's attention takes the KV policy
        as an argument, :meth:`merge`); the training model's subclass hooks its attention modules instead."""
        return contextlib.nullcontext(self)

    def kv_mask(self) -> torch.Tensor:
        """``active`` broadcast over keys/values [b, heads, s, d]."""
        return self.active[:, None, :, None]

    def merge(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of Core layer ``layer`` with the exited tokens' replaced by their latest
        (every token computes the first loop, which seeds them). Readout mode: unchanged (no token froze)."""
        if not self.freeze:
            return k, v
        if layer in self.latest:
            mask = self.kv_mask()
            k = torch.where(mask, k, self.latest[layer][0])
            v = torch.where(mask, v, self.latest[layer][1])
        self.latest[layer] = (k, v)
        return k, v

    def fill(self, cache: Cache, first_slot_of_loop, loops: range) -> None:
        """Write the latest keys/values into the cache slots of ``loops`` (all skipped by every token)."""
        for t in loops:
            for layer, (k, v) in sorted(self.latest.items()):
                cache.update(k, v, first_slot_of_loop(t) + layer)


# ======================================================================================
# ---- Ouro (Zhu et al. 2025): the learned exit gate, its exit distribution, Q-exit ----
# ======================================================================================
# Zhu et al. 2025, "Scaling Latent Reasoning via Looped Language Models", arXiv 2510.25741, Sec. 3.2
# (gating mechanism) and Sec. 3.4 (Q-exit); compared with ByteDance's modeling_ouro.py
# (``early_exit_gate``, the exit pdf and the ``exit_threshold`` branch of ``OuroForCausalLM.forward``).


class ExitGate(nn.Module):
    """Ouro's exit gate: the instantaneous exit probability after loop t (Sec. 3.2),

        lambda_t = sigmoid(w^T RMSNorm(h^t) + b),   w [1, d], b [1].

    As in Ouro (``early_exit_gate(norm(h))``) it reads the state through the model's final RMSNorm,
    the normed state its LM head reads. With a Coda this stack's head reads C(h^t) instead; the gate
    stays on the recurrent state so that a token's exit decision depends on its own state only (the
    Coda's attention mixes tokens, which the per-token exit and its KV cache cannot replay,
    ``TokenExit``). Initialised as Ouro's ``nn.Linear(d, 1)`` under transformers' init: weight
    N(0, initializer_range), bias 0, so lambda starts near 1/2. Returns the fp32 logit [...]."""

    def __init__(self, d: int, std: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, d))
        self.bias = nn.Parameter(torch.zeros(1))
        if std is not None:
            with torch.no_grad():
                self.weight.normal_(0.0, std)

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        return F.linear(normed, self.weight.to(normed.dtype), self.bias.to(normed.dtype)).squeeze(-1).float()


def exit_log_distribution(gate_logits: torch.Tensor) -> torch.Tensor:
    """log p(t|x) of Ouro's exit distribution over t = 1..T from the gate logits [..., T] (Sec. 3.2):

        p(t|x) = lambda_t S_{t-1}  (t < T),   p(T|x) = S_{T-1},   S_t = prod_{j<=t} (1 - lambda_j),

    the remainder going to the last step (modeling_ouro.py: ``p_i = remaining_prob`` at the last UT
    step; lambda_T is not used). In log space (log lambda = logsigmoid(a), log(1 - lambda) =
    logsigmoid(-a)): exact where lambda saturates, so the entropy of Stage I stays finite."""
    a = gate_logits.to(torch.promote_types(gate_logits.dtype, torch.float32))  # fp32 at least (float64 stays)
    log_exit, log_stay = F.logsigmoid(a), F.logsigmoid(-a)
    zero = torch.zeros_like(log_stay[..., :1])
    log_survival = torch.cat([zero, torch.cumsum(log_stay[..., :-1], dim=-1)], dim=-1)  # log S_{t-1}
    return torch.cat([log_exit[..., :-1] + log_survival[..., :-1], log_survival[..., -1:]], dim=-1)


def exit_distribution(gate_logits: torch.Tensor) -> torch.Tensor:
    """p(t|x) [..., T] (:func:`exit_log_distribution`); sums to 1 over t."""
    return exit_log_distribution(gate_logits).exp()


class ExitCDF:
    """Q-exit's running cumulative exit probability, per token (Ouro Sec. 3, its inference rule): after loop t,
    CDF(t) = sum_{j<=t} p(j|x) = sum_{j<=t} lambda_j S_{j-1}; a token exits at the first t with
    CDF(t) >= q (modeling_ouro.py: ``cumsum(pdf) >= exit_threshold``, the last step when never
    reached). It needs lambda_1..lambda_t only, so the decision is made online, loop by loop, and
    does not depend on the cap r (one-pass sweeps stay exact). q = 0 exits after the first loop."""

    def __init__(self, shape, device):
        self.cdf = torch.zeros(shape, dtype=torch.float32, device=device)
        self.log_survival = torch.zeros(shape, dtype=torch.float32, device=device)  # log S_{t-1}

    def update(self, gate_logit: torch.Tensor) -> torch.Tensor:
        """Add loop t's p(t|x) = lambda_t S_{t-1}; returns CDF(t)."""
        self.cdf = self.cdf + (self.log_survival + F.logsigmoid(gate_logit.float())).exp()
        self.log_survival = self.log_survival + F.logsigmoid(-gate_logit.float())
        return self.cdf


def check_q_exit(criterion: str, threshold, exit_gate: str) -> None:
    """Q-exit reads the learned gate, and its threshold q is a probability."""
    if criterion != "q_exit":
        return
    if exit_gate != "learned":
        raise ValueError("exit_criterion='q_exit' exits on the learned exit gate's cumulative exit probability: "
                         f"expected exit_gate='learned', got {exit_gate!r}")
    if not threshold <= 1:
        raise ValueError(f"exit_threshold={threshold!r} with exit_criterion='q_exit': expected q in [0, 1] "
                         "(a cumulative exit probability)")


def check_weighted_exit(config, weighted: bool, criterion: str) -> None:
    """Ouro's weighted exit reads the head on every loop's state with the learned gate's p(t|x), and nothing
    else decides the depth."""
    if isinstance(weighted, bool) and not weighted:
        return
    if not isinstance(weighted, bool):
        raise ValueError(f"weighted_exit={weighted!r}: expected True or False")
    if getattr(config, "exit_gate", "none") != "learned":
        raise ValueError("weighted_exit=True weighs every loop's logits by the learned exit gate's p(t|x): expected "
                         f"exit_gate='learned', got {getattr(config, 'exit_gate', 'none')!r}")
    if config.coda_layers:
        raise ValueError(f"weighted_exit=True with coda_layers={config.coda_layers}: Ouro's expected logits read the "
                         "head on every loop's state, which a Coda (one KV cache slot per block) cannot serve; "
                         "expected coda_layers=0")
    if criterion != "none":
        raise ValueError(f"weighted_exit=True with exit_criterion={criterion!r}: the expected logits run every loop "
                         "for every token; expected exit_criterion='none'")


def expected_logits(head, states, exit_pdf: torch.Tensor) -> torch.Tensor:
    """Ouro's weighted exit (modeling_ouro.py:813-814, ``compute_expected_logits``): the logits of every loop's
    state weighed by the exit distribution, sum_t p(t|x) head(h^t), accumulated over t = 1..r as Ouro does."""
    logits = None
    for t, h in enumerate(states):
        step = head(h)
        weighted = step * exit_pdf[..., t, None].to(step.dtype)
        logits = weighted if logits is None else logits + weighted
    return logits


# ======================================================================================
# ---- Huginn (Geiping et al. 2025): sandwich blocks, a recurrent state drawn from noise, KV-cache sharing ----
# ======================================================================================
# Geiping et al. 2025, "Scaling up Test-Time Compute with Latent Reasoning: A Recurrent Depth Approach",
# arXiv 2502.05171, Sec. 3 (architecture) and Sec. 6 (KV-cache sharing); compared with
# seal-rg/recurrent-pretraining, recpre/raven_modeling_minimal.py (SandwichBlock, RavenForCausalLM.
# initialize_state / iterate_forward / core_block_forward, HuginnDynamicCache "compress-s") and
# recpre/model_dynamic.py (RecurrentGPT: adapter init, state_init "like-init").


def block_residual_norms(config) -> bool:
    """Whether blocks carry Huginn's sandwich norms (``block_norm="sandwich"``; exports written before
    the field existed: pre-norm)."""
    return getattr(config, "block_norm", "pre") == "sandwich"


def block_output_norms(config) -> bool:
    """Whether blocks carry Ouro's norms on each branch's output before the residual sum (``block_norm=
    "branch_output"``; modeling_ouro.py:413-434, ``input_layernorm_2`` / ``post_attention_layernorm_2``)."""
    return getattr(config, "block_norm", "pre") == "branch_output"


def initial_state_noise(shape, std: float, generator: torch.Generator | None = None,
                        device=None) -> torch.Tensor:
    """Huginn's initial recurrent state s_0 ~ TruncNormal(0, std^2) truncated to [-3 std, 3 std]
    (``initialize_state``: ``trunc_normal_(x, std=std, a=-3 std, b=3 std)``), fp32, drawn from
    ``generator`` (torch's global generator when None, as Huginn)."""
    x = torch.empty(shape, dtype=torch.float32, device=device)
    return nn.init.trunc_normal_(x, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)


_NOISE_TABLES: dict[tuple, torch.Tensor] = {}


def position_noise(seed: int, positions: torch.Tensor, hidden_size: int, max_positions: int, std: float,
                   dtype: torch.dtype) -> torch.Tensor:
    """s_0 of the tokens at ``positions`` [b, s] -> [b, s, d]: row p of one table [max_positions, d] drawn
    on the CPU from ``seed`` (:func:`initial_state_noise`). A token's noise depends on the seed and its
    position only -- not on the batch, its padding, the device, or whether earlier tokens come from a KV
    cache -- so cached decoding equals cache-free decoding and one-pass loop sweeps stay exact."""
    if positions.numel() and int(positions.max()) >= max_positions:
        raise ValueError(f"position {int(positions.max())}: the initial-state noise covers positions "
                         f"< max_position_embeddings={max_positions}")
    key = (int(seed), max_positions, hidden_size, float(std))
    if key not in _NOISE_TABLES:
        _NOISE_TABLES.clear()  # one table at a time: it is max_positions x d floats
        _NOISE_TABLES[key] = initial_state_noise((max_positions, hidden_size), std,
                                                 torch.Generator().manual_seed(int(seed)))
    return _NOISE_TABLES[key][positions.cpu()].to(device=positions.device, dtype=dtype)


def noise_initial_state(config, h0: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The recurrence's first state under ``initial_state="noise"`` (Huginn: s_0 from noise, the Prelude
    output e = h0 entering every step through the initial-state injection, Eq. (1) of Geiping et al.):
    position-keyed noise of ``initial_state_seed`` (:func:`position_noise`), or with
    ``initial_state_seed=None`` a fresh draw from torch's global generator, as Huginn's
    ``initialize_state`` (each forward then differs: seed it with ``torch.manual_seed``)."""
    b, s, d = h0.shape
    if config.initial_state_seed is None:
        return initial_state_noise((b, s, d), config.initial_state_std, None, h0.device).to(h0.dtype)
    return position_noise(config.initial_state_seed, position_ids.expand(b, s), d, config.max_position_embeddings,
                          config.initial_state_std, h0.dtype)


def huginn_readout_obstacle(config) -> str | None:
    """Noise drawn afresh by every forward (``initial_state_seed=None``) gives every r its own trajectory."""
    if getattr(config, "initial_state", "prelude") == "noise" and config.initial_state_seed is None:
        return ("the initial state is drawn from torch's global generator by every forward (initial_state_seed="
                "None), so each r runs from other noise; set initial_state_seed to an integer")
    return None


def _check_huginn(config) -> None:
    for key, allowed in (("block_norm", BLOCK_NORMS), ("initial_state", INITIAL_STATES)):
        if getattr(config, key) not in allowed:
            raise ValueError(f"LoopLMConfig.{key}={getattr(config, key)!r}: expected one of {allowed}")
    std, seed, budget = config.initial_state_std, config.initial_state_seed, config.kv_cache_loops
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0:
        raise ValueError(f"LoopLMConfig.initial_state_std={std!r}: expected a positive number")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"LoopLMConfig.initial_state_seed={seed!r}: expected an integer >= 0, or None")
    if config.initial_state == "noise" and config.initial_injection == "none":
        raise ValueError("LoopLMConfig.initial_state='noise' with initial_injection='none': the Prelude output "
                         "would never reach the Core; expected an initial-state injection (Huginn's is 'dense')")
    _check_kv_cache_loops(budget)


def _check_kv_cache_loops(budget) -> None:
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"LoopLMConfig.kv_cache_loops={budget!r}: expected None (one KV slot per loop) or an "
                         "integer >= 1 (cache slots shared across loops)")


def kv_cache_loops(config, num_loops: int) -> int:
    """Loops with their own KV-cache slots: r, or the budget m of ``kv_cache_loops`` when smaller."""
    budget = getattr(config, "kv_cache_loops", None)
    return num_loops if budget is None else min(int(budget), num_loops)


class OverwritingCache:
    """KV-cache sharing across recurrences (Huginn Sec. 6, ``HuginnDynamicCache`` "compress-s"): with a
    budget of m loops, Core layer k of loop t reads and writes the slot of loop t mod m. A slot reused
    within one forward holds this forward's tokens already, from loop t - m: their entries are replaced
    (Huginn overwrites entry [slot][position]), not appended. Earlier tokens keep the keys/values of the
    last loop that wrote the slot for them, which the new tokens then attend to."""

    def __init__(self, cache: Cache):
        self.cache = cache

    def update(self, k: torch.Tensor, v: torch.Tensor, slot: int, *args, **kwargs):
        layer = self.cache.layers[slot]
        n = k.shape[-2]
        layer.keys = torch.cat([layer.keys[..., : layer.keys.shape[-2] - n, :], k], dim=-2)
        layer.values = torch.cat([layer.values[..., : layer.values.shape[-2] - n, :], v], dim=-2)
        return layer.keys, layer.values


def shared_kv_slot(config, cache: Cache | None, step: int):
    """(first Core slot of loop ``step``, the cache its attention writes to) under ``kv_cache_loops``
    (without a budget: slot p + step·s, appended to as always)."""
    m = kv_cache_loops(config, step + 1)
    first = config.prelude_layers + (step % m) * config.core_layers
    return first, (OverwritingCache(cache) if cache is not None and step >= m else cache)


# ======================================================================================
# The recurrence: Prelude output -> Core x r -> the state the Coda reads (one implementation)
# ======================================================================================
# The loop is written here once: this file's LoopLMModel runs it, and so does the training model
# (megatron_loop/model/looplm.py), which passes in what it does differently (its own blocks,
# activation recomputation, truncated backpropagation, its per-step noise seed). A change to the loop --
# a new exit rule, a readout, a conditioning term -- is made here, for training and export alike.


def loop_transition(model, h: torch.Tensor, h0: torch.Tensor, psi, past, core) -> torch.Tensor:
    """One complete loop h_l -> h_{l+1}: injection, the shared Core, Loop Gating,

        u_l     = I_phi(h_l, h0) + sum_j B_j(h_{l-j} - h_l)       Eqs. (initial_state_injection_variants,
        y_l     = Core(u_l; psi_l)                                      history_state_injection)
        h_{l+1} = x_l + g_l (y_l - x_l) with LG,   y_l otherwise    Eq. (loop_level_timestep_gating)

    with x_l = h_l, or u_l under ``loop_gating_reference="injected"``, then h_{l+1} <- Norm(h_{l+1}) under Ouro's
    between-loop norm (``loop_norm``: the model's final norm, as Ouro's ``self.norm`` after every UT step).
    ``core(u, psi)`` runs the Core's blocks (this file's, with their KV-cache slots; the training model's
    own blocks); ``past`` is the history window h_{l-1}, ..., h_{l-m_l} (:func:`history_window`). The
    conditioning modules are
    ``model``'s attributes, absent (or None) when not configured."""
    injection = getattr(model, "initial_injection", None)
    u = h if injection is None else injection(h, h0)
    history = getattr(model, "history_injection", None)
    if history is not None and past:  # differences are taken w.r.t. the recurrent state h_l, not the injected input
        u = u + history(h, list(past))
    y = core(u, psi)
    gating = getattr(model, "loop_gating", None)
    if gating is not None:
        y = gating(u if getattr(model.config, "loop_gating_reference", "state") == "injected" else h, y, psi)
    if getattr(model.config, "loop_norm", False):  # Ouro: every loop ends in the final norm (modeling_ouro.py:618)
        y = model.norm(y)
    return y


def state_norm(model, h: torch.Tensor) -> torch.Tensor:
    """The final norm of a recurrent state, what the exit gate and the ``kl`` readout read: ``h`` itself under
    Ouro's between-loop norm (``loop_norm``: every loop ends in the final norm, so the state is its output and
    Ouro's gate and head read it as it is, modeling_ouro.py:618-620), else Norm(h)."""
    return h if getattr(model.config, "loop_norm", False) else model.norm(h)


def output_norm(model, h: torch.Tensor) -> torch.Tensor:
    """The final norm after the Coda: none where there is no Coda and the state already ends in the final norm
    (``loop_norm``; Ouro's head reads the last normed state), else Norm(h)."""
    return h if getattr(model.config, "loop_norm", False) and not len(model.coda) else model.norm(h)


class Recurrence:
    """The loop of one forward, Sec. 2.1 Eq. (loop-state-evolution): from the Prelude output h0 through
    ``num_loops`` executions of the Core to the state the Coda reads, with what every loop may add --
    Huginn's noise start, the history window, the timestep inputs psi_l, per-token adaptive exit
    (:class:`TokenExit`), Ouro's gate logits, the trajectory, and readouts of the Coda at given loop counts.

    What the two models do differently is passed in:

    * ``step(l, h, h0, psi, past) -> h_{l+1}``: how loop l runs (:func:`loop_transition` over the Core:
      here with the loop's KV-cache slots and the exit's KV policy; in training through its own
      blocks, activation recomputation and truncated backpropagation);
    * ``start(h0)``: the first recurrent state under ``initial_state="noise"`` (Huginn; position-keyed
      noise here, a per-step draw in training);
    * ``exit_rule(h)``: the :class:`TokenExit` of an adaptive forward, made from the first recurrent state
      (its ``applied()`` context wraps the loops: the training model's KV policy hooks);
    * ``gate(h)``: Ouro's exit-gate logit of a state (``exit_gate="learned"``), kept per loop;
    * ``readout(h, t)`` with ``readout_loops``: the Coda's output on h^t after loop t (one-pass readouts);
    * ``on_exit(l)``: called when every token has exited after loop l, before the remaining loops are skipped.

    ``run(h0)`` returns the last state; the token exit, the trajectory (``keep_trajectory``: the first
    recurrent state, h^1, ..., h^r), the states h^1..h^r (``keep_states``), the gate logits and the
    readouts stay on the object."""

    def __init__(self, config, step, num_loops: int, *, psi=None, start=None, exit_rule=None, gate=None,
                 keep_trajectory: bool = False, keep_states: bool = False, readout=None, readout_loops=None,
                 on_exit=None):
        self.config, self.step, self.num_loops, self.psi = config, step, num_loops, psi
        self.start, self.exit_rule, self.gate, self.on_exit = start, exit_rule, gate, on_exit
        self.keep_trajectory, self.keep_states = keep_trajectory, keep_states
        self.readout, self.readout_loops = readout, readout_loops
        self.token_exit: TokenExit | None = None
        self.trajectory: list[torch.Tensor] | None = None
        self.states: list[torch.Tensor] = []
        self.gate_logits: list[torch.Tensor] = []
        self.read: dict[int, torch.Tensor] = {}  # loop count -> the Coda's output on its state (readout_loops)

    def run(self, h0: torch.Tensor) -> torch.Tensor:
        h = h0
        if getattr(self.config, "initial_state", "prelude") == "noise":  # Huginn: s_0 from noise; h0 enters by injection
            h = self.start(h0)
        self.trajectory = [h] if self.keep_trajectory else None
        self.token_exit = None if self.exit_rule is None else self.exit_rule(h)
        with self.token_exit.applied() if self.token_exit is not None else contextlib.nullcontext():
            return self._loops(h, h0)

    def _loops(self, h: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        cfg, token_exit = self.config, self.token_exit
        completed: list[torch.Tensor] = []  # h_1 .. h_l (h0 excluded), for the history window
        w = cfg.history_window if getattr(cfg, "history_injection", "none") != "none" else 0
        for loop in range(self.num_loops):
            past = history_window(completed, w) if w else []  # h_{l-1}, ..., h_{l-m_l}
            psi = None if self.psi is None else self.psi[loop]
            h_next = self.step(loop, h, h0, psi, past)
            h = h_next if token_exit is None else token_exit.step(h, h_next)
            del h_next  # no second reference to the state past its loop (it would outlive the Core)
            if self.gate is not None:
                self.gate_logits.append(self.gate(h))
            if self.keep_states:
                self.states.append(h)
            if w:
                completed = completed[-w:] + [h]  # keep only what later windows can reach
            if self.trajectory is not None:
                self.trajectory.append(h)
            done = token_exit is not None and token_exit.done
            if self.readout_loops is not None and (loop + 1 in self.readout_loops or done):
                out = self.readout(h if token_exit is None else token_exit.final(h), loop + 1)
                # every token exited: the state stays h, so every later r reads the same
                self.read.update({t: out for t in self.readout_loops if t == loop + 1 or (done and t > loop + 1)})
            if done:  # every token exited: the remaining loops would change nothing
                if self.on_exit is not None:
                    self.on_exit(loop)
                break
        return h if token_exit is None else token_exit.final(h)  # readout mode: each token's exit loop's state

    def exit_logits(self) -> torch.Tensor | None:
        """Ouro's gate logits of every loop, stacked on a last dimension of ``num_loops`` (None without a
        gate). Every token exited early: its state, hence lambda, stays that of its last loop."""
        if not self.gate_logits:
            return None
        return torch.stack(self.gate_logits + self.gate_logits[-1:] * (self.num_loops - len(self.gate_logits)),
                           dim=-1)


def coda_input(model, h: torch.Tensor) -> torch.Tensor:
    """What the Coda reads of h^r: Norm(h^r) under Huginn's ``norm_core_output`` (the final norm used twice),
    else h^r."""
    return model.norm(h) if getattr(model.config, "norm_core_output", False) else h


# ======================================================================================
# The block and the model
# ======================================================================================


def modulated_residual(u: torch.Tensor, norm, branch, modulation, psi, residual_norm=None,
                       output_norm=None) -> torch.Tensor:
    """One residual branch with its timestep modulation, Eq. (branch_timestep_modulation):

        u+ = u + g * Branch((1 + s) * Norm(u)),

    (g, s) from ``modulation(psi)`` (BranchGating: s = 0, AdaLN); g = 1, s = 0 without modulation.
    ``residual_norm`` (Huginn's sandwich block, ``block_norm="sandwich"``): u+ = Norm'(u + g * Branch(...)),
    the residual stream normalised after the branch is added (SandwichBlock: x = norm_2(attn(norm_1(x)) + x)).
    ``output_norm`` (Ouro's block, ``block_norm="branch_output"``): u+ = u + g * Norm'(Branch(...)), the branch's
    output normalised before it is added (modeling_ouro.py:413-434: ``residual + input_layernorm_2(attn(...))``).
    The training model's block applies the same function."""
    x = norm(u)
    run = branch if output_norm is None else (lambda v: output_norm(branch(v)))
    if modulation is None:
        out = u + run(x)
    else:
        gate, scale = modulation(psi)
        if scale is not None:
            x = x * (1 + scale.to(x.dtype))
        out = u + gate.to(u.dtype) * run(x)
    return out if residual_norm is None else residual_norm(out)


class LoopLMBlock(nn.Module):
    """Pre-norm decoder layer. Core blocks may modulate each residual branch with the
    timestep (Eq. branch_timestep_modulation): u+ = u + g * Branch((1 + s) * Norm(u))."""

    def __init__(self, config: LoopLMConfig, timestep: str = "none"):
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = LoopLMRMSNorm(d, config.rms_norm_eps)
        self.self_attn = LoopLMAttention(config)
        self.post_attention_layernorm = LoopLMRMSNorm(d, config.rms_norm_eps)
        self.mlp = LoopLMMLP(config)
        # Huginn's sandwich block: norm_2 / norm_4 of SandwichBlock, after each residual sum
        self.attn_residual_norm = LoopLMRMSNorm(d, config.rms_norm_eps) if block_residual_norms(config) else None
        self.mlp_residual_norm = LoopLMRMSNorm(d, config.rms_norm_eps) if block_residual_norms(config) else None
        # Ouro's block: input_layernorm_2 / post_attention_layernorm_2, on each branch's output
        self.attn_output_norm = LoopLMRMSNorm(d, config.rms_norm_eps) if block_output_norms(config) else None
        self.mlp_output_norm = LoopLMRMSNorm(d, config.rms_norm_eps) if block_output_norms(config) else None
        if timestep == "branch_gating":
            self.attn_gate, self.mlp_gate = BranchGating(), BranchGating()
        elif timestep in ("adaln", "shortcut"):  # shortcut: LoopFormer's parametrisation of the same AdaLN
            self.attn_adaln, self.mlp_adaln = (AdaLN(d, **adaln_arguments(timestep, d)) for _ in range(2))
        self.modulation = {"branch_gating": "branch_gating", "adaln": "adaln", "shortcut": "adaln"}.get(timestep)

    def _branch_modulation(self, which: str):
        if self.modulation == "branch_gating":
            return getattr(self, f"{which}_gate")
        if self.modulation == "adaln":
            return getattr(self, f"{which}_adaln")
        return None

    def forward(self, h: torch.Tensor, rope, mask, cache: Cache | None, slot: int,
                psi: torch.Tensor | None = None, kv_merge=None) -> torch.Tensor:
        h = modulated_residual(h, self.input_layernorm,
                               lambda x: self.self_attn(x, rope, mask, cache, slot, kv_merge),
                               self._branch_modulation("attn"), psi, self.attn_residual_norm, self.attn_output_norm)
        return modulated_residual(h, self.post_attention_layernorm, self.mlp, self._branch_modulation("mlp"), psi,
                                  self.mlp_residual_norm, self.mlp_output_norm)


@dataclass
class LoopLMModelOutput(BaseModelOutputWithPast):
    """``BaseModelOutputWithPast`` plus ``exit_loops`` [b, s]: loops each token ran (adaptive exit), and
    ``readout_states``: the normed Coda outputs of each of ``readout_loops`` (one-pass readouts)."""

    exit_loops: torch.LongTensor | None = None
    readout_states: tuple[torch.Tensor, ...] | None = None
    # Ouro's exit distribution p(t|x), t = 1..r, [b, s, r] (model with exit_gate="learned")
    exit_pdf: torch.Tensor | None = None


def _checked_readout_loops(loops, num_loops) -> list[int]:
    """``readout_loops`` as increasing distinct ints >= 1 whose last is ``num_loops`` (when given)."""
    values = list(loops) if isinstance(loops, (list, tuple, range)) else []
    if (not values or any(isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 1 <= r <= MAX_LOOPS
                          for r in values) or sorted(set(values)) != values):
        raise ValueError(f"readout_loops={loops!r}: expected a list of distinct loop counts from 1 to {MAX_LOOPS} in "
                         "increasing order")
    if num_loops is not None and int(num_loops) != values[-1]:
        raise ValueError(f"readout_loops={values!r} with num_loops={num_loops}: the forward runs to the largest "
                         "readout; pass num_loops=None or its value")
    return [int(r) for r in values]


@dataclass
class LoopLMCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus ``exit_loops`` [b, s]: loops each token ran (adaptive exit), and
    ``exit_pdf`` [b, s, r]: Ouro's exit distribution p(t|x) (exit_gate="learned")."""

    exit_loops: torch.LongTensor | None = None
    exit_pdf: torch.Tensor | None = None


def _shaping_fields(config, name: str) -> str:
    """The config fields that size the weight ``name`` (for the message of a weight of another shape)."""
    sized_by = {"history_injection": ("history_window", "hidden_size"), "embed": ("vocab_size", "hidden_size"),
                "lm_head": ("vocab_size", "hidden_size"), "mlp": ("intermediate_size", "hidden_size"),
                "self_attn": ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")}
    keys = next((keys for part, keys in sized_by.items() if part in name), ("hidden_size",))
    return ", ".join(f"{key}={getattr(config, key)}" for key in keys)


class LoopLMPreTrainedModel(PreTrainedModel):
    config_class = LoopLMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["LoopLMBlock"]
    _supports_sdpa = True
    _supports_cache_class = True

    def __init__(self, config: LoopLMConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        _warn_if_untested_transformers(config)

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """``from_pretrained``: weights missing for, or unused by, the layout config.json describes
        are an error (an edited ``core_layers`` would otherwise run randomly initialised blocks,
        reported only in the MISSING/UNEXPECTED table). Added to transformers' own ``error_msgs``,
        which ``from_pretrained`` raises before it prints that table."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        unused = {k for k in loading_info.unexpected_keys if not k.startswith("lm_head.")}  # AutoModel: no head
        blocks = {kind: sorted({re.sub(r"^(.*?\.\d+)\..*$", r"\1.*", k) for k in keys}) for kind, keys in
                  (("missing", loading_info.missing_keys), ("unused", unused))}
        shapes = sorted(getattr(loading_info, "mismatched_keys", ()) or ())
        if shapes:  # a from_pretrained kwarg that sizes weights (history_window=5): said with the field, not
            # transformers' "ignore_mismatched_sizes" (which would run the model on reinitialised weights)
            name, saved, built = shapes[0]
            loading_info.error_msgs.append(
                f"LoopLM weights do not fit this config: {name} has shape {list(saved)} in the export, "
                f"{list(built)} for this config ({_shaping_fields(self.config, name)}); expected the config.json "
                "written with these weights: from_pretrained takes inference settings (num_loops, timestep_grid, "
                "exit_criterion, exit_threshold, kv_cache_loops, initial_state_seed), not the architecture")
        if blocks["missing"] or blocks["unused"]:
            c = self.config
            loading_info.error_msgs.append(
                f"LoopLM weights do not match config.json (layout {c.prelude_layers}+{c.core_layers}x{c.train_loops}"
                f"+{c.coda_layers}): missing {', '.join(blocks['missing']) or 'none'}; unused "
                f"{', '.join(blocks['unused']) or 'none'}; expected the config.json written with these weights "
                "(was it edited after the export?)")

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """N(0, initializer_range) linears/embeddings, unit norms, identity conditioning.
        Tensors already loaded from a checkpoint (``_is_hf_initialized``) are left alone."""
        std = self.config.initializer_range

        def fill(t: torch.Tensor, fn) -> None:
            if not getattr(t, "_is_hf_initialized", False):
                fn(t)

        if isinstance(module, (nn.Linear, nn.Embedding)):
            fill(module.weight, lambda t: t.normal_(0.0, std))
            if getattr(module, "bias", None) is not None:  # LoopFormer's embedders (the backbone has no biases)
                fill(module.bias, lambda t: t.zero_())
        elif isinstance(module, LoopLMRMSNorm):
            fill(module.weight, lambda t: t.fill_(1.0))
        elif isinstance(module, InitialStateInjection):
            for name, p in module.named_parameters():
                if name == "a":
                    fill(p, lambda t: t.fill_(1.0))
                elif name == "weight":
                    d = p.shape[0]
                    fill(p, lambda t: t.copy_(torch.cat([torch.eye(d), torch.zeros(d, d)], dim=1)))
                else:
                    fill(p, lambda t: t.zero_())
        elif isinstance(module, ExitGate):  # Ouro's nn.Linear(d, 1) under transformers' init
            fill(module.weight, lambda t: t.normal_(0.0, std))
            fill(module.bias, lambda t: t.zero_())
        elif isinstance(module, (HistoryStateInjection, LoopGating, BranchGating, AdaLN)):
            for p in module.parameters(recurse=False):
                fill(p, lambda t: t.zero_())


def _attention_mask(attention_mask: torch.Tensor | None, batch: int, q_len: int, past: int,
                    device: torch.device) -> torch.Tensor | None:
    """Boolean SDPA mask [b, 1, q, past + q] from a 2D padding mask (1 = token, 0 = pad).

    ``None`` when plain causal attention suffices. Causality is by cache index; a padded
    query attends to itself only, so no row is empty.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask.bool() if attention_mask.dtype in (torch.bool, torch.long, torch.int) else attention_mask
    has_padding = attention_mask is not None and not bool(attention_mask.all())
    if not has_padding and (past == 0 or q_len == 1):
        return None
    k_len = past + q_len
    k_idx = torch.arange(k_len, device=device)
    q_idx = torch.arange(past, k_len, device=device)
    allowed = (k_idx[None, :] <= q_idx[:, None])[None, None]  # [1, 1, q, k]
    if has_padding:
        keys = attention_mask[:, -k_len:].bool()[:, None, None, :]
        allowed = allowed & (keys | (k_idx[None, :] == q_idx[:, None])[None, None])
    return allowed.expand(batch, 1, q_len, k_len)


class LoopLMModel(LoopLMPreTrainedModel):
    """Embedding -> Prelude -> Core x r (weight-tied, conditioned) -> Coda -> final RMSNorm."""

    def __init__(self, config: LoopLMConfig):
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.prelude = nn.ModuleList(LoopLMBlock(config) for _ in range(config.prelude_layers))
        self.core = nn.ModuleList(LoopLMBlock(config, config.timestep) for _ in range(config.core_layers))
        self.coda = nn.ModuleList(LoopLMBlock(config) for _ in range(config.coda_layers))
        self.norm = LoopLMRMSNorm(d, config.rms_norm_eps)
        self.rotary_emb = LoopLMRotaryEmbedding(config)
        if config.initial_injection != "none":
            self.initial_injection = InitialStateInjection(config.initial_injection, d)
        if config.history_injection != "none":
            self.history_injection = HistoryStateInjection(config.history_injection, d, config.history_window)
        if config.timestep == "loop_gating":
            self.loop_gating = LoopGating()
        if config.timestep == "shortcut":  # LoopFormer (ShortcutEmbedding)
            self.shortcut_embedding = ShortcutEmbedding(d)
        if getattr(config, "exit_gate", "none") == "learned":  # Ouro (ExitGate)
            self.exit_gate = ExitGate(d)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def _timestep_inputs(self, r: int, grid: str, device, loop_steps=None) -> torch.Tensor:
        """What loop l's timestep modules read, row l of [r, .]: psi_l (Eq. timestep_features) or, for
        LoopFormer's shortcut modulation, c_l = ShortcutEmbedding(t_l, dt_l) on the same grid; along the
        trajectory ``loop_steps`` (step sizes n_l / K, :func:`trajectory_times`) when given."""
        if loop_steps is not None:
            t, dt = trajectory_times(loop_steps, self.config.train_loops)
        elif self.config.timestep != "shortcut":
            return timestep_features(r, self.config.train_loops, grid, device)
        else:
            t, dt = timestep_times(r, self.config.train_loops, grid)
        if self.config.timestep != "shortcut":
            return psi_features(t, dt).to(device=device, dtype=torch.float32)
        # fp32 on the device (the sinusoids are fp32 anyway; some devices have no float64)
        return self.shortcut_embedding(t.float().to(device), dt.float().to(device))[:r]

    def _first_core_slot(self, step: int) -> int:
        return self.config.prelude_layers + step * self.config.core_layers

    def _loop_iteration(self, step, h, h0, psi, past_states, rope, mask, cache,
                        token_exit: TokenExit | None = None) -> torch.Tensor:
        """h_l -> h_{l+1} (:func:`loop_transition`): the shared Core with the cache slots of loop ``step``."""
        first_slot, cache = shared_kv_slot(self.config, cache, step)  # Huginn's KV-cache sharing (kv_cache_loops)

        def core(y, psi):
            for k, block in enumerate(self.core):
                merge = None if token_exit is None else (lambda kk, vv, layer=k: token_exit.merge(layer, kk, vv))
                y = block(y, rope, mask, cache, first_slot + k, psi, merge)
            return y

        return loop_transition(self, h, h0, psi, past_states, core)

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None,
                num_loops: int | None = None, timestep_grid: str | None = None,
                output_hidden_states: bool | None = None, exit_criterion: str | None = None,
                exit_threshold: float | None = None, exit_readout=None, readout_loops=None, loop_steps=None,
                exit_mode: str | None = None, weighted_exit: bool | None = None, **kwargs) -> LoopLMModelOutput:
        """``exit_criterion`` / ``exit_threshold`` / ``exit_mode`` override the config per call; ``exit_readout``
        maps normed states to logits for the ``kl`` criterion (``LoopLMForCausalLM`` passes its head).

        ``readout_loops`` (loop counts r_1 < ... < r_n): one forward at r_n that also runs the Coda and
        the final norm on h^{r_i} after loop r_i; ``readout_states`` holds them, each bitwise equal to
        ``last_hidden_state`` of a forward at ``num_loops=r_i`` (refused where the trajectory depends
        on r: :func:`readout_obstacle`). No KV cache: a cache has one layout per r."""
        cfg = self.config
        given = _take_cache(past_key_values, dict(kwargs))
        num_loops, criterion, threshold, mode = _checked_call(
            cfg, input_ids, given is not None and given.get_seq_length() > 0, num_loops, timestep_grid, exit_criterion,
            exit_threshold, exit_mode, weighted_exit)
        weighted = cfg.weighted_exit if weighted_exit is None else weighted_exit  # Ouro: every loop's head input kept
        readouts = None
        if readout_loops is not None and weighted:
            raise ValueError("readout_loops reads the logits of given loop counts; weighted_exit reads their expectation: "
                             "pass one of them")
        if readout_loops is not None:
            readouts = _checked_readout_loops(readout_loops, num_loops)
            obstacle = readout_obstacle(cfg, readouts, timestep_grid)
            if obstacle is not None:
                raise ValueError(f"readout_loops={readouts}: {obstacle}; run forward(num_loops=r) for each r")
            if given is not None:
                raise ValueError("readout_loops reads several loop counts out of one forward and keeps no KV cache; "
                                 "pass no past_key_values / cache with it")
            num_loops, use_cache = readouts[-1], False
        r = cfg.loops if num_loops is None else int(num_loops)
        if loop_steps is not None:  # LoopFormer: a budget of len(loop_steps) loops on its own schedule
            if readouts is not None:
                raise ValueError("loop_steps runs one schedule of step sizes; pass no readout_loops with it")
            r = len(loop_steps)
        if r < 1:
            raise ValueError(f"num_loops={num_loops}: expected an integer >= 1")
        if criterion == "kl" and exit_readout is None:
            raise ValueError("exit_criterion='kl' reads the next-token distribution out of each loop's state: "
                             "call LoopLMForCausalLM (it passes its LM head), or use 'cosine'")
        past_key_values = _take_cache(past_key_values, kwargs)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        b, s, _ = inputs_embeds.shape
        use_cache = cfg.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        if (cache is not None and not past and type(cache) is DynamicCache and cache.layers
                and len(cache.layers) != cfg.kv_cache_slots(r)):
            # generate() sizes its empty cache from config.num_hidden_layers (the config's loop count): a per-call
            # num_loops needs its own slot count (generate(ids, num_loops=3) on a K = 2 export: an IndexError)
            cache.layers = [type(cache.layers[0])() for _ in range(cfg.kv_cache_slots(r))]
        if cache is not None and past and len(cache.layers) != cfg.kv_cache_slots(r):
            raise ValueError(f"the KV cache has {len(cache.layers)} block slots but num_loops={r} uses "
                             f"{cfg.kv_cache_slots(r)}; keep num_loops fixed while decoding")
        if cache is not None and criterion != "none" and mode == "freeze" and kv_cache_loops(cfg, r) < r:
            raise ValueError(f"kv_cache_loops={cfg.kv_cache_loops} with exit_criterion={criterion!r}: KV-cache "
                             "sharing and the freezing exit are not combined; set kv_cache_loops=None, "
                             "exit_mode='readout' or use_cache=False")

        if position_ids is None:
            if attention_mask is not None and attention_mask.dim() == 2:  # left padding: count real tokens
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -s:]
            else:
                position_ids = torch.arange(past, past + s, device=inputs_embeds.device)[None].expand(b, s)
        rope = self.rotary_emb(position_ids, inputs_embeds.dtype)
        mask = _attention_mask(attention_mask, b, s, past, inputs_embeds.device)
        psi_all = (self._timestep_inputs(r, timestep_grid or cfg.timestep_grid, inputs_embeds.device, loop_steps)
                   if cfg.timestep != "none" else None)

        h = inputs_embeds
        for i, block in enumerate(self.prelude):
            h = block(h, rope, mask, cache, i)
        gate = getattr(self, "exit_gate", None)  # Ouro: lambda_t of every loop -> exit_pdf
        reading = ((lambda x: gate(state_norm(self, x))) if criterion == "q_exit"
                   else (lambda x: exit_readout(state_norm(self, x))))
        loops = Recurrence(
            cfg, lambda loop, x, x0, psi, hist: self._loop_iteration(loop, x, x0, psi, hist, rope, mask, cache,
                                                                      loops.token_exit),
            r, psi=psi_all, start=lambda x0: noise_initial_state(cfg, x0, position_ids),
            exit_rule=None if criterion == "none" else (lambda x: TokenExit(criterion, threshold, x, reading, mode)),
            gate=None if gate is None else (lambda x: gate(state_norm(self, x))), keep_trajectory=bool(output_hidden_states),
            keep_states=bool(weighted),
            readout=lambda x, t: self._coda(x, rope, mask, None, t), readout_loops=readouts,
            on_exit=None if cache is None else (
                lambda loop: loops.token_exit.fill(cache, self._first_core_slot, range(loop + 1, r))))
        h = loops.run(h)
        h = loops.read[r] if readouts is not None else self._coda(h, rope, mask, cache, r)
        logits = loops.exit_logits()
        exit_pdf = None if logits is None else exit_distribution(logits)
        token_exit = loops.token_exit
        # ``hidden_states`` is the recurrent trajectory (h^0, ..., h^r), not per-block outputs (with
        # adaptive exit: up to the last loop any token ran).
        return LoopLMModelOutput(last_hidden_state=h, **{CACHE_FIELD: cache},
                                 hidden_states=tuple(loops.trajectory) if loops.trajectory is not None else None,
                                 exit_loops=None if token_exit is None else token_exit.loops, exit_pdf=exit_pdf,
                                 readout_states=(tuple(output_norm(self, x) for x in loops.states) if weighted else
                                                 None if readouts is None else tuple(loops.read[t] for t in readouts)))

    def _coda(self, h: torch.Tensor, rope, mask, cache: Cache | None, r: int) -> torch.Tensor:
        """C(h^r) and the final norm; the Coda's cache slots follow the r loops' (p + r·s + j; p + m·s + j
        with KV-cache sharing). ``norm_core_output``: C reads Norm(h^r), the final norm applied twice (Huginn)."""
        coda_slot = self.config.prelude_layers + kv_cache_loops(self.config, r) * self.config.core_layers
        h = coda_input(self, h)
        for j, block in enumerate(self.coda):
            h = block(h, rope, mask, cache, coda_slot + j)
        return output_norm(self, h)


class LoopLMForCausalLM(LoopLMPreTrainedModel, GenerationMixin):
    """LoopLM with the LM head; ``generate()`` uses a DynamicCache with L(r) slots."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LoopLMConfig):
        super().__init__(config)
        self.model = LoopLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                num_loops: int | None = None, timestep_grid: str | None = None,
                output_hidden_states: bool | None = None, exit_criterion: str | None = None,
                exit_threshold: float | None = None, loop_steps=None, exit_mode: str | None = None,
                weighted_exit: bool | None = None, **kwargs) -> LoopLMCausalLMOutput:
        """Logits ``[b, s, V]``; with ``labels`` the mean next-token cross-entropy (labels[:, t] is
        token t; -100 ignored). ``num_loops`` / ``timestep_grid`` / ``exit_criterion`` /
        ``exit_threshold`` override the config per call; ``exit_loops`` [b, s] holds the loops each
        token ran under adaptive exit (the loop whose state each token reads, ``exit_mode``: :class:`TokenExit`).
        ``loop_steps`` (LoopFormer's step schedules: positive integers
        n_l summing to K, step sizes n_l / K) runs len(loop_steps) loops at t_l = (n_0 + ... +
        n_{l-1}) / K, dt_l = n_l / K instead of the grid of ``num_loops``. ``weighted_exit`` (Ouro's, config field
        or per call): the logits are the expectation over the exit distribution, sum_t p(t|x) head(h^t)
        (:func:`expected_logits`), for the loss as well, as Ouro's."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=_take_cache(past_key_values, kwargs), inputs_embeds=inputs_embeds, use_cache=use_cache,
                         num_loops=num_loops, timestep_grid=timestep_grid,
                         output_hidden_states=output_hidden_states, exit_criterion=exit_criterion,
                         exit_threshold=exit_threshold, exit_readout=self.lm_head, loop_steps=loop_steps,
                         exit_mode=exit_mode, weighted_exit=weighted_exit)
        h = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        weighted = self.config.weighted_exit if weighted_exit is None else weighted_exit

        def head(keep):
            if weighted:  # Ouro's expected logits over the exit distribution
                return expected_logits(self.lm_head, [x[:, keep, :] for x in out.readout_states], out.exit_pdf[:, keep])
            return self.lm_head(h[:, keep, :])

        logits = head(keep)
        loss = None
        if labels is not None:
            full = logits if (isinstance(logits_to_keep, int) and logits_to_keep == 0) else head(slice(None))
            shift = full[:, :-1].float()
            loss = F.cross_entropy(shift.reshape(-1, shift.shape[-1]), labels[:, 1:].reshape(-1).to(shift.device),
                                   ignore_index=-100)
        return LoopLMCausalLMOutput(loss=loss, logits=logits, **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
                                    hidden_states=out.hidden_states, exit_loops=out.exit_loops,
                                    exit_pdf=out.exit_pdf)

    def generate(self, inputs=None, *args, **kwargs):
        """``GenerationMixin.generate`` after :func:`_checked_call` of its arguments: transformers indexes the
        token ids before the first forward (1-d ids were an IndexError inside it)."""
        _checked_call(self.config, kwargs.get("input_ids", inputs), False, kwargs.get("num_loops"),
                      kwargs.get("timestep_grid"), kwargs.get("exit_criterion"), kwargs.get("exit_threshold"),
                      kwargs.get("exit_mode"), kwargs.get("weighted_exit"))
        return super().generate(inputs, *args, **kwargs)

    def readout_obstacle(self, loops, timestep_grid: str | None = None) -> str | None:
        """Why :meth:`loop_readouts` cannot serve ``loops`` (None: it can); :func:`readout_obstacle`."""
        return readout_obstacle(self.config, loops, timestep_grid)

    def loop_readouts(self, input_ids: torch.LongTensor, loops, attention_mask: torch.Tensor | None = None,
                      timestep_grid: str | None = None, exit_criterion: str | None = None,
                      exit_threshold: float | None = None, exit_mode: str | None = None) -> dict[int, torch.Tensor]:
        """Logits [b, s, V] of every r in ``loops`` from one forward at max(loops), each bitwise equal to
        ``forward(input_ids, num_loops=r).logits``: the Coda and the head read h^r after loop r (a loop
        sweep r = 1..R then costs R loops, not R(R+1)/2). Refused (ValueError) where the trajectory
        depends on r, e.g. timestep conditioning on the rescaled grid (:func:`readout_obstacle`)."""
        if isinstance(loops, (list, tuple, range, set, frozenset)) and all(
                isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in loops):
            loops = sorted(set(loops))  # any order; anything else is refused by the forward, naming readout_loops
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                         timestep_grid=timestep_grid, exit_criterion=exit_criterion, exit_threshold=exit_threshold,
                         exit_readout=self.lm_head, readout_loops=loops, exit_mode=exit_mode)
        return {int(r): self.lm_head(h) for r, h in zip(loops, out.readout_states)}


LoopLMConfig.register_for_auto_class()
LoopLMForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["LoopLMConfig", "LoopLMModel", "LoopLMForCausalLM", "LoopLMPreTrainedModel", "timestep_features",
           "readout_obstacle",
           "history_window", "modulated_residual", "InitialStateInjection", "HistoryStateInjection", "LoopGating", "BranchGating", "AdaLN",
           "TokenExit", "exit_distance", "ShortcutEmbedding", "adaln_arguments", "timestep_times", "trajectory_times",
           "psi_features", "ExitGate", "ExitCDF", "exit_distribution", "exit_log_distribution"]
