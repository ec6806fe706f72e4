"""LoopLM: token embedding -> Prelude -> Core applied r times (weight-tied) -> Coda -> RMSNorm -> LM head.

Paper Sec. 2.1, Eq. (loop-state-evolution):

    h^0 = P(e(x));   h^{t+1} = F(h^t; gamma_t), 0 <= t < r;   y = W C(h^r)

``gamma_t`` is the optional conditioning (``conditioning.py``): initial-state injection,
history-state injection and timestep conditioning (Loop Gating, Branch Gating, AdaLN), in
any combination:

    u_l     = I_phi(h_l, h0) + sum_j B_j(h_{l-j} - h_l)           (injection, Sec. 5.1)
    y_l     = F(u_l; psi_l)                                          (core, BG/AdaLN inside F)
    h_{l+1} = h_l + g_l (y_l - h_l)   with LG,   y_l otherwise       (Loop Gating)
              (u_l in place of h_l with ``model.loop_gating_reference: injected``)

Training runs exactly K loops with full backpropagation through all of them (App. C.2
"Recurrent backpropagation"); nothing is detached. Activation checkpointing (``per_loop``,
``selective``, ``auto`` with a memory budget, ``per_block``) lives in ``checkpointing.py``;
gradients equal ``none`` in every mode.

Variable depth (issue 15), all off by default: ``backprop_loops=N`` runs the first r - N loops
without a graph (truncated backpropagation; their states still flow forward, and as history
states they are constants), and ``exit_criterion`` / ``exit_threshold`` make r a cap with a
per-token exit at inference (``adaptive_exit.py``). The training loop draws r per step
(``training/loop_sampling.py``).

Fast path (issues 8 and 13, ``megatron_loop/perf.py``): the loss is a chunked linear +
cross-entropy that never materialises the full-vocabulary logits of the batch (Liger-Kernel's
fused kernel on CUDA); ``model.compile`` (auto: on with CUDA) compiles each block once (the loop
stays in Python, so any r reuses the compiled block); the step never reads a value back to the host.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from megatron_loop.config import ModelConfig
from megatron_loop.errors import LoopConfigError
from megatron_loop.model import roles
from megatron_loop.model.checkpointing import (FULL, NONE, PendingMemory, loop_kinds, loop_memory, plan_loops,
                                               planning_budget, run_checkpointed, run_loop,
                                               selective_recompute_fraction)
from megatron_loop.model.compat import ensure_parallel_state, rope_freqs, rope_inv_freq, transformer_config
from megatron_loop.model.conditioning import (HistoryStateInjection, InitialStateInjection, LoopGating,
                                              branch_modulation, history_window, timestep_features)
from megatron_loop.model.layers import loop_block_spec
from megatron_loop.parallel import ParallelConfig
from megatron_loop.parallel.grads import mark_sequence_parallel
from megatron_loop.parallel.vocab import TensorParallelEdges, lm_head, token_embedding
from megatron_loop.perf import (DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, chunked_linear_cross_entropy, compile_blocks,
                                uncompile_blocks)

with __import__("warnings").catch_warnings():
    __import__("warnings").simplefilter("ignore")
    from megatron.core.transformer.spec_utils import build_module


@dataclass
class LoopLMOutput(ModelOutput):
    """Attribute and key access (transformers' ModelOutput is a dict): DeepSpeed ZeRO 3 finds the
    output tensors it hooks for backward re-gathering inside dicts, not inside plain dataclasses."""

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    # Recurrent trajectory [h^0, h^1, ..., h^r], each [batch, seq, hidden] (when requested).
    trajectory: list[torch.Tensor] | None = None
    # Adaptive exit: the loops each token ran, [batch, seq] (None with exit_criterion='none').
    exit_loops: torch.Tensor | None = None


class LoopLM(nn.Module):
    """A looped decoder ``p+s×K+c`` built from megatron-core blocks.

    Tensor parallelism (``megatron_loop/parallel``): the TP size is that of megatron-core's groups
    (``parallel.initialize_parallel``; TP = 1 when none were built); ``parallel`` adds sequence
    parallelism and is checked against them.
    """

    def __init__(self, config: ModelConfig, parallel: ParallelConfig | None = None):
        super().__init__()
        config.validate()
        self.config = config
        ensure_parallel_state()
        self.tensor_parallel = TensorParallelEdges.of(config, parallel)
        layout = self.tensor_parallel.layout
        d = config.hidden_size
        tcfg = transformer_config(
            num_layers=config.physical_depth, hidden_size=d, intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
            head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, qk_norm=config.qk_norm,
            initializer_range=config.initializer_range, tensor_model_parallel_size=layout.tp_size,
            sequence_parallel=layout.sequence_parallel)
        spec = loop_block_spec(config.qk_norm)
        numbers = iter(range(1, config.physical_depth + 1))

        def blocks(n: int) -> nn.ModuleList:
            return nn.ModuleList(build_module(spec, config=tcfg, layer_number=next(numbers)) for _ in range(n))

        self.embed_tokens = token_embedding(config.vocab_size, d, config.initializer_range, tcfg, layout)
        self.prelude = blocks(config.prelude_layers)
        self.core = blocks(config.core_layers)
        self.coda = blocks(config.coda_layers)
        self.norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        roles.set_role(self.norm.weight, roles.NORM)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = lm_head(d, config.vocab_size, config.initializer_range, tcfg, layout)

        # ---- conditioning (Sec. 5); all of it starts as the identity
        self.initial_injection = (None if config.initial_injection == "none"
                                  else InitialStateInjection(config.initial_injection, d, config.injection_init_noise))
        self.history_injection = (None if config.history_injection == "none"
                                  else HistoryStateInjection(config.history_injection, d, config.history_window))
        self.loop_gating = LoopGating() if config.timestep == "loop_gating" else None
        for block in self.core:  # only the shared core layers are modulated
            block.set_timestep_modulation(branch_modulation(config.timestep, d),
                                          branch_modulation(config.timestep, d), config.timestep)

        # Rotary frequencies stay fp32 on the host (not a buffer: ``model.bfloat16()``, as DeepSpeed's
        # bf16 engine does, would round them and shift every angle away from the HF export's).
        with torch.device("cpu"):
            self._inv_freq_fp32 = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.activation_checkpointing = config.activation_checkpointing
        self.activation_checkpointing_budget_gib = config.activation_checkpointing_budget_gib
        self.activation_checkpointing_selective_cost = config.activation_checkpointing_selective_cost
        self._checkpoint_plans: dict[tuple, object] = {}  # activation_checkpointing=auto, per input shape
        self._plans_to_report: list[str] = []  # new plans' descriptions, for the training log
        # What the training step will still allocate when a plan is made (optimizer state, DeepSpeed's
        # buckets): set by optim.build_engine, counted by an ``auto`` plan without a budget.
        self.pending_memory: Callable[[], PendingMemory] | None = None
        self.selective_blocks = False  # set while a selective loop runs (checkpointing.run_loop)
        self.loss_chunk_tokens = DEFAULT_CHUNK_TOKENS
        self.loss_implementation = config.loss_implementation
        # psi grids and rotary angles, built once per key on the device: later forwards copy
        # nothing host->device (a pageable copy would synchronise the CUDA stream).
        self._device_constants: dict[tuple, torch.Tensor] = {}
        for name, p in self.named_parameters():
            roles.role_of(p)  # every parameter must carry a role (raises otherwise)
        mark_sequence_parallel(self)  # replicated parameters whose gradients are partial over TP
        self.compile_note = f"model.compile={config.compile}: " + (
            "each block compiled once (one graph per block kind)" if config.compile_enabled else "off")
        if config.compile_enabled:
            compile_blocks(self.blocks())

    # ------------------------------------------------------------------ helpers
    @property
    def uses_timestep(self) -> bool:
        return self.config.timestep != "none"

    def blocks(self) -> list[nn.Module]:
        """Every transformer block: Prelude, Core, Coda."""
        return [*self.prelude, *self.core, *self.coda]

    def fit_compile_to_zero(self, stage: int) -> str:
        """Under ZeRO-3, DeepSpeed's parameter-gathering hooks run around every submodule and are
        ``torch.compiler.disable``d, so a compiled block breaks into many graphs (15 graphs and 28
        breaks for one block's forward and backward on CPU, against one whole graph under ZeRO-1:
        tests/perf_scripts/zero_engine.py). ``compile: auto`` is then off; ``compile: true`` is kept
        (the user asked) and the note says what it costs. Returns :attr:`compile_note`."""
        if stage == 3 and self.config.compile_enabled:
            if self.config.compile == "auto":
                uncompile_blocks(self.blocks())
                self.compile_note = ("model.compile=auto: off under ZeRO-3 (DeepSpeed's compiler-disabled parameter "
                                     "hooks would split each block into many graphs)")
            else:
                self.compile_note += ("; under ZeRO-3 DeepSpeed's compiler-disabled parameter hooks split each block "
                                      "into many graphs (compile: auto would turn it off)")
        return self.compile_note

    def new_checkpoint_plans(self) -> list[str]:
        """The descriptions of ``auto`` plans made since the last call (each once, for the log)."""
        notes, self._plans_to_report = self._plans_to_report, []
        return notes

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def external_parameters(self) -> list[nn.Parameter]:
        """Parameters this module applies outside their owning submodule's ``forward``: the LM head
        (or tied embedding) weight, used by the chunked loss. ZeRO 3 must gather them for the root's
        forward and backward (``optim.build_engine`` registers them)."""
        return [self.head_weight()]

    def num_parameters(self, backbone_only: bool = False) -> int:
        """Trainable parameters; ``backbone_only`` excludes injection and timestep parameters."""
        return sum(p.numel() for p in self.parameters()
                   if not (backbone_only and roles.role_of(p) == roles.CONDITIONING))

    def _constant(self, key: tuple, make) -> torch.Tensor:
        """A small constant tensor (psi grid, rotary angles) built on first use and kept."""
        if key not in self._device_constants:
            with torch.inference_mode(False):  # a tensor made under inference_mode could not enter autograd later
                self._device_constants[key] = make()
        return self._device_constants[key]

    @property
    def rope_inv_freq(self) -> torch.Tensor:
        """fp32 inverse rotary frequencies on the model's device."""
        device = self.embed_tokens.weight.device
        return self._constant(("inv_freq", device), lambda: self._inv_freq_fp32.to(device))

    def _rope(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self._constant(("rope", seq_len, device), lambda: rope_freqs(self.rope_inv_freq, seq_len, device))

    def _timestep_features(self, r: int, grid: str, device: torch.device) -> torch.Tensor:
        return self._constant(("psi", r, grid, device),
                              lambda: timestep_features(r, self.config.train_loops, grid, device=device))

    # Checkpointed regions draw no random numbers (no dropout anywhere), so the RNG states are not
    # saved per region: saving costs a copy per loop/block (the CPU state alone is 5 KB, the only
    # memory per checkpointed loop beyond h_l).
    def _run_block(self, block: nn.Module, h: torch.Tensor, rope: torch.Tensor, psi: torch.Tensor | None):
        if self.activation_checkpointing == "per_block" and torch.is_grad_enabled():
            return run_checkpointed(FULL, block, h, rope, psi)
        return block(h, rope, psi, selective=self.selective_blocks)

    def loop_checkpointing(self, num_loops: int, hidden: torch.Tensor) -> tuple[str, ...] | None:
        """What each loop keeps for backward (``model/checkpointing.py``); None without autograd."""
        if not torch.is_grad_enabled():
            return None
        s, b = hidden.shape[:2]  # [s, b, d]

        def plan():
            key = (num_loops, b, s, hidden.dtype, hidden.device, self.activation_checkpointing_budget_gib)
            if key not in self._checkpoint_plans:  # planned once per shape, dtype, device and budget
                budget = planning_budget(self.activation_checkpointing_budget_gib, hidden.device, self.pending_memory)
                params = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in self.parameters()
                             if p.requires_grad)  # ZeRO-3 partitions report their full size as ds_numel
                memory = loop_memory(self.config, b, s, hidden.element_size(), self.loss_chunk_tokens, params)
                cost = self.activation_checkpointing_selective_cost
                plan = plan_loops(num_loops, memory, budget,
                                  selective_recompute_fraction(self.config, s) if cost is None else cost)
                self._checkpoint_plans[key] = plan
                self._plans_to_report.append(f"{plan.describe()} (micro-batch {b} x {s}, {hidden.dtype})")
            return self._checkpoint_plans[key]

        return loop_kinds(self.activation_checkpointing, num_loops, plan)

    def loop_iteration(self, h: torch.Tensor, h0: torch.Tensor, rope: torch.Tensor, psi: torch.Tensor | None,
                       *past: torch.Tensor) -> torch.Tensor:
        """One complete loop h_l -> h_{l+1}: injection, the shared core, loop-level gating.

        ``past`` is the history window h_{l-1}, ..., h_{l-m_l} (possibly empty).
        """
        u = h if self.initial_injection is None else self.initial_injection(h, h0)
        if self.history_injection is not None and past:
            # differences are taken w.r.t. the recurrent state h_l, not the injected input
            u = u + self.history_injection(h, list(past))
        y = u
        for block in self.core:
            y = self._run_block(block, y, rope, psi)
        if self.loop_gating is not None:  # reference h_l or u_l: conditioning.LoopGating
            y = self.loop_gating(u if self.config.loop_gating_reference == "injected" else h, y, psi)
        return y

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, num_loops: int | None = None, labels: torch.Tensor | None = None,
                return_trajectory: bool = False, timestep_grid: str | None = None,
                compute_logits: bool = True, backprop_loops: int | None = None,
                exit_criterion: str = "none", exit_threshold: float = 0.0) -> LoopLMOutput:
        """Logits ``[b, s, V]`` and, with ``labels``, the mean next-token loss.

        ``labels`` follows the HF convention: ``labels[:, t]`` is the token at position t and the
        loss averages the s - 1 predictions of tokens 1..s-1 (positions with -100 ignored).
        ``num_loops`` defaults to the training K; any r >= 1 runs. ``timestep_grid`` overrides
        the config's inference grid (``rescaled`` | ``prefix``).
        ``backprop_loops`` N: only the last N loops build a graph (``None``: all of them).
        ``exit_criterion`` (``none`` | ``kl`` | ``cosine``) with ``exit_threshold``: per-token
        adaptive exit with r as the cap (inference only, ``adaptive_exit.py``); ``exit_loops``
        of the output then holds each token's loop count.
        """
        if exit_criterion != "none" and torch.is_grad_enabled():
            with torch.no_grad():  # exit decisions are not differentiable
                return self.forward(input_ids, num_loops, labels, return_trajectory, timestep_grid, compute_logits,
                                    backprop_loops, exit_criterion, exit_threshold)
        if exit_criterion != "none":
            from megatron_loop.model.adaptive_exit import check_exit

            self.tensor_parallel.check_exit(exit_criterion)
            check_exit(exit_criterion, exit_threshold)
        cfg = self.config
        r = cfg.train_loops if num_loops is None else int(num_loops)
        if r < 1:
            raise LoopConfigError(f"num_loops={num_loops}: expected an integer >= 1")
        if backprop_loops is not None and int(backprop_loops) < 1:
            raise LoopConfigError(f"backprop_loops={backprop_loops}: expected None (all loops) or an integer >= 1")
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise LoopConfigError(f"input length {input_ids.shape[1]} exceeds model.max_position_embeddings="
                                  f"{cfg.max_position_embeddings}")
        grid = timestep_grid or cfg.timestep_grid
        psi_all = self._timestep_features(r, grid, input_ids.device) if self.uses_timestep else None

        h = self.tensor_parallel.embed(self.embed_tokens, input_ids)  # [s, b, d] ([s/N, b, d] sequence parallel)
        rope = self._rope(input_ids.shape[1], input_ids.device)
        for block in self.prelude:
            h = self._run_block(block, h, rope, None)

        h0 = h
        trajectory = [h0] if return_trajectory else None
        completed: list[torch.Tensor] = []  # h_1 .. h_l (h0 excluded), for the history window
        w = cfg.history_window if self.history_injection is not None else 0
        # Truncated backpropagation: loops 0 .. detached-1 run without a graph; h_detached is a constant.
        detached = 0 if backprop_loops is None else max(r - int(backprop_loops), 0)
        # none / selective / full per graphed loop (checkpointing.py); detached loops keep nothing
        kinds = self.loop_checkpointing(r - detached, h)
        token_exit = None
        if exit_criterion != "none":
            from megatron_loop.model.adaptive_exit import TokenExit

            token_exit = TokenExit(exit_criterion, exit_threshold, h0, lambda x: F.linear(self.norm(x), self.head_weight()))
        with token_exit.latest_kv(self.core) if token_exit is not None else nullcontext():
            for step in range(r):
                psi = None if psi_all is None else psi_all[step]
                past = history_window(completed, w) if w else []
                if step < detached:
                    with torch.no_grad():
                        h_next = self.loop_iteration(h, h0, rope, psi, *past)
                else:
                    h_next = run_loop(kinds[step - detached] if kinds else NONE, self, self.loop_iteration,
                                      h, h0, rope, psi, *past)
                h = h_next if token_exit is None else token_exit.step(h, h_next)
                del h_next  # no second reference to the state past its loop (it would outlive the core)
                if w:
                    completed = completed[-w:] + [h]  # keep only what later windows can reach
                if trajectory is not None:
                    trajectory.append(h)
                if token_exit is not None and token_exit.done:
                    break  # every token exited: the remaining loops would change nothing

        for block in self.coda:
            h = self._run_block(block, h, rope, None)
        h = self.tensor_parallel.head_input(self.norm(h)).transpose(0, 1)  # [b, s, d]

        loss = None
        if labels is not None:
            loss = self.loss(h, labels)
        logits = self.tensor_parallel.logits(h, self.head_weight()) if compute_logits else None
        if trajectory is not None:
            trajectory = [self.tensor_parallel.gather_sequence(t).transpose(0, 1) for t in trajectory]
        exit_loops = None if token_exit is None else token_exit.loops.transpose(0, 1)
        return LoopLMOutput(logits=logits, loss=loss, trajectory=trajectory, exit_loops=exit_loops)

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (App. C.2) from final hidden states ``[b, s, d]``.

        Chunked over tokens (``self.loss_chunk_tokens`` at a time); equal to ``F.cross_entropy`` of
        the full fp32 logits (``perf.chunked_linear_cross_entropy``). ``model.loss_implementation``
        picks torch's fp32 chunks (CPU, the reference) or Liger-Kernel's fused kernel (CUDA).
        """
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        return chunked_linear_cross_entropy(h, self.head_weight(), labels[:, 1:].reshape(-1),
                                            chunk_size=self.loss_chunk_tokens, ignore_index=IGNORE_INDEX,
                                            implementation=self.tensor_parallel.loss_implementation(
                                                self.loss_implementation))


def build_model(config: ModelConfig, device: torch.device | str | None = None,
                parallel: ParallelConfig | None = None) -> LoopLM:
    """Build a LoopLM (CPU unless ``device`` is given; ``"meta"`` for shape-only dry runs)."""
    if device is None:
        return LoopLM(config, parallel)
    with torch.device(device):
        return LoopLM(config, parallel)
