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
"Recurrent backpropagation"); nothing is detached.

Variable depth, all off by default: ``backprop_loops=N`` runs the first r - N loops without a
graph (truncated backpropagation; their states still flow forward, and as history states they
are constants), and ``exit_criterion`` / ``exit_threshold`` make r a cap with a per-token exit at
inference (``adaptive_exit.py``). The training loop draws r per step (``training/loop_sampling.py``).

The loss (``loss.py``) is a chunked linear + cross-entropy that never materialises the
full-vocabulary logits of the batch. How the model executes for training -- activation
recomputation (``recompute.py``; gradients equal in every mode) and compiled blocks -- is
applied from outside after the model is built (``parallel/parallelize.py``); the loop itself stays in Python, so
any r reuses the compiled blocks. The step never reads a value back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from megatron_loop.config import ModelConfig
from megatron_loop.errors import LoopConfigError
from megatron_loop.model import roles
from megatron_loop.model.adaptive_exit import TokenExit, check_exit
from megatron_loop.model.exit_gate import ExitGate, exit_distribution, weighted_exit_output
from megatron_loop.model.compat import (RotaryTables, rope_freqs, rope_inv_freq, rope_tables,
                                        transformer_config)
from megatron_loop.hf.modeling_looplm import Recurrence, coda_input, loop_transition, output_norm, state_norm
from megatron_loop.model.conditioning import (HistoryStateInjection, InitialStateInjection, LoopGating,
                                              ShortcutEmbedding, branch_modulation, timestep_features)
from megatron_loop.model.initial_state import check_tensor_parallel, huginn_adapter_init_, noise_state
from megatron_loop.model.layers import loop_block_spec
from megatron_loop.model.loss import DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, chunked_linear_cross_entropy
from megatron_loop.model.options import LoopOptions
from megatron_loop.model.shortcut import ShortcutTrajectory, shortcut_objective
from megatron_loop.model.shortcut import timestep_inputs as shortcut_timestep_inputs
from megatron_loop.config.validation import EXIT_GATE_TP_REFUSAL
from megatron_loop.model.placement import ParallelPlacement
from megatron_loop.model.vocab import TensorParallelEdges, lm_head, token_embedding

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
    # Ouro's exit distribution p(t|x), t = 1..r, [batch, seq, r] (model.exit_gate=learned; exit_gate.py)
    exit_pdf: torch.Tensor | None = None
    # The head input [batch, seq, hidden] (the final normed states), with return_hidden (LoopFormer, shortcut.py)
    hidden: torch.Tensor | None = None


class LoopLM(nn.Module):
    """A looped decoder ``p+s×K+c`` built from megatron-core blocks.

    Built plain: the constructor creates no process group and reads no global parallel state. ``placement``
    (:class:`~megatron_loop.model.placement.ParallelPlacement`, None: one rank) says where this rank sits in
    the tensor- and data-parallel grid; at TP > 1 the caller owns megatron-core's groups of that size
    (``parallel.bootstrap.init_model_parallel``), inside which megatron-core builds its layers.
    ``fast_path=False`` builds the blocks from megatron-core's modules only (the reference the default fast
    path is tested against: ``layers.loop_block_spec``; its attention reads megatron-core's groups when it
    runs, so its caller makes them, ``parallel.bootstrap.ensure_groups``).
    """

    def __init__(self, config: ModelConfig, placement: ParallelPlacement | None = None, fast_path: bool = True):
        super().__init__()
        config.validate()
        self.config = config
        self.tensor_parallel = TensorParallelEdges.of(config, placement)
        placement = self.tensor_parallel.placement
        d = config.hidden_size
        tcfg = transformer_config(
            num_layers=config.physical_depth, hidden_size=d, intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
            head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, qk_norm=config.qk_norm,
            initializer_range=config.initializer_range, tensor_model_parallel_size=placement.tp_size,
            sequence_parallel=placement.sequence_parallel)
        # fast_path=False: megatron-core's modules throughout (the reference of layers.loop_block_spec)
        spec = loop_block_spec(config.qk_norm, fast_path, sandwich=config.block_norm == "sandwich",
                               branch_output=config.block_norm == "branch_output")
        numbers = iter(range(1, config.physical_depth + 1))

        def blocks(n: int) -> nn.ModuleList:
            return nn.ModuleList(build_module(spec, config=tcfg, layer_number=next(numbers)) for _ in range(n))

        self.embed_tokens = token_embedding(config.vocab_size, d, config.initializer_range, tcfg, placement)
        self.prelude = blocks(config.prelude_layers)
        self.core = blocks(config.core_layers)
        self.coda = blocks(config.coda_layers)
        self.norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        roles.set_role(self.norm.weight, roles.NORM)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = lm_head(d, config.vocab_size, config.initializer_range, tcfg, placement)

        # ---- conditioning (Sec. 5); all of it starts as the identity
        self.initial_injection = (None if config.initial_injection == "none"
                                  else InitialStateInjection(config.initial_injection, d, config.injection_init_noise))
        self.history_injection = (None if config.history_injection == "none"
                                  else HistoryStateInjection(config.history_injection, d, config.history_window))
        if config.initial_state == "noise":  # Huginn: s_0 from noise, the adapter initialised as its own
            check_tensor_parallel(config, placement.tp_size)
            if config.initial_injection == "dense":
                huginn_adapter_init_(self.initial_injection.weight)
        self.loop_gating = LoopGating() if config.timestep == "loop_gating" else None
        # LoopFormer's shortcut modulation (model/shortcut.py): c_l from (t_l, dt_l), read by an AdaLN per branch
        self.shortcut_embedding = (ShortcutEmbedding(d, config.initializer_range) if config.timestep == "shortcut"
                                   else None)
        modulation_kind = "adaln" if config.timestep == "shortcut" else config.timestep
        for block in self.core:  # only the shared core layers are modulated
            block.set_timestep_modulation(branch_modulation(config.timestep, d, config.initializer_range),
                                          branch_modulation(config.timestep, d, config.initializer_range),
                                          modulation_kind)
        # ---- Ouro's learned exit gate (exit_gate.py); its training objective comes with a step's options
        if config.exit_gate == "learned" and self.tensor_parallel.enabled:
            raise LoopConfigError(EXIT_GATE_TP_REFUSAL)
        self.exit_gate = ExitGate(d, config.initializer_range) if config.exit_gate == "learned" else None

        # Rotary frequencies stay fp32 on the host (not a buffer: ``model.bfloat16()``, as DeepSpeed's
        # bf16 engine does, would round them and shift every angle away from the HF export's).
        with torch.device("cpu"):
            self._inv_freq_fp32 = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        # ---- what training adds, set by parallel/parallelize.py only (a model built for inference, export or
        # probes keeps these): what each loop keeps for backward (None: everything; an ActivationRecompute
        # when applied), the line saying what runs compiled, whether the TP sum of partial gradients is hooked.
        self.recompute = None
        self.compile_note: str | None = None
        self.tp_gradient_sum = False
        self.loss_chunk_tokens = DEFAULT_CHUNK_TOKENS
        self.loss_implementation = config.loss_implementation
        # psi grids and rotary angles, built once per key on the device: later forwards copy
        # nothing host->device (a pageable copy would synchronise the CUDA stream).
        self._device_constants: dict[tuple, torch.Tensor] = {}
        for name, p in self.named_parameters():
            roles.role_of(p)  # every parameter must carry a role (raises otherwise)

    # ------------------------------------------------------------------ helpers
    @property
    def uses_timestep(self) -> bool:
        return self.config.timestep != "none"

    def blocks(self) -> list[nn.Module]:
        """Every transformer block: Prelude, Core, Coda."""
        return [*self.prelude, *self.core, *self.coda]

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

    def _rope(self, seq_len: int, device: torch.device, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """Rotary angles with their cos and sin in the activations' ``dtype``: once per length, device, dtype."""
        return self._constant(("rope", seq_len, device, dtype),
                              lambda: rope_tables(rope_freqs(self.rope_inv_freq, seq_len, device), dtype))

    def _timestep_features(self, r: int, grid: str, device: torch.device) -> torch.Tensor:
        return self._constant(("psi", r, grid, device),
                              lambda: timestep_features(r, self.config.train_loops, grid, device=device))

    def timestep_inputs(self, r: int, grid: str, device: torch.device,
                        loop_steps: tuple[int, ...] | None = None) -> torch.Tensor:
        """Row l: what loop l's timestep modules read, psi_l (Eq. timestep_features) or LoopFormer's c_l
        (``shortcut.timestep_inputs``), on the grid of r or along the trajectory ``loop_steps``."""
        if loop_steps is None and self.shortcut_embedding is None:
            return self._timestep_features(r, grid, device)
        return shortcut_timestep_inputs(self, r, grid, device, loop_steps)

    def loop_iteration(self, h: torch.Tensor, h0: torch.Tensor, rope: RotaryTables, psi: torch.Tensor | None,
                       *past: torch.Tensor) -> torch.Tensor:
        """One complete loop h_l -> h_{l+1} (injection, the shared core, Loop Gating): the export's
        :func:`~megatron_loop.hf.modeling_looplm.loop_transition` over this model's megatron-core blocks.
        ``past`` is the history window h_{l-1}, ..., h_{l-m_l} (possibly empty); tensors are arguments, not
        closed over, so that a recomputed loop (``recompute.py``) sees them as its inputs."""

        def core(y: torch.Tensor, psi: torch.Tensor | None) -> torch.Tensor:
            for block in self.core:
                y = block(y, rope, psi)
            return y

        return loop_transition(self, h, h0, psi, past, core)

    def coda_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the Coda reads of h^r after the last loop (the export's :func:`coda_input`: Norm(h^r) under
        Huginn's ``norm_core_output``, else h^r). The forward and the probes' Coda readouts at each r of a
        one-pass sweep (``probes/runner.py``) both read it here."""
        return coda_input(self, h)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, options: LoopOptions | None = None,
                **fields) -> LoopLMOutput:
        """Logits ``[b, s, V]`` and, with ``labels``, the mean next-token loss; what runs is ``options``
        (:class:`~megatron_loop.model.options.LoopOptions`, one object a training step passes whole), or its
        fields as keywords (``model(ids, num_loops=3)``).

        ``labels`` follows the HF convention: ``labels[:, t]`` is the token at position t and the
        loss averages the s - 1 predictions of tokens 1..s-1 (positions with -100 ignored).
        ``num_loops`` defaults to the training K; any r >= 1 runs. ``timestep_grid`` overrides
        the config's inference grid (``rescaled`` | ``prefix``).
        ``backprop_loops`` N: only the last N loops build a graph (``None``: all of them).
        ``exit_criterion`` (``none`` | ``kl`` | ``cosine`` | ``q_exit``) with ``exit_threshold``: per-token
        adaptive exit with r as the cap (inference only, ``adaptive_exit.py``; the forward runs without a
        graph); ``exit_loops`` of the output then holds each token's exit loop. ``exit_mode`` (``readout`` |
        ``freeze``; None: readout for q_exit, as Ouro, freeze otherwise) is how an exit acts (``TokenExit``).
        With Ouro's exit gate, ``exit_pdf`` holds p(t|x) and, in training mode with ``labels`` and an
        :class:`~megatron_loop.model.exit_gate.ExitObjective` as ``objective``, the loss is Ouro's Stage I or
        II objective (``exit_gate.py``).
        LoopFormer (``shortcut.py``): ``loop_steps`` runs a trajectory of step sizes n_l / K (positive
        integers summing to K) in place of the grid of r; with ``labels``, a
        :class:`ShortcutTrajectory` as ``objective`` makes the loss LoopFormer's objective; ``return_hidden``
        keeps the head input [b, s, d] in ``hidden``.
        Huginn (``initial_state.py``): with ``model.initial_state: noise`` the recurrence starts from
        noise, an iid draw seeded by ``initial_state_seed`` (a training step's ``step_seed``) or, when
        None, the position-keyed noise of ``model.initial_state_seed`` (the HF export's).

        The loop itself is the export's :class:`~megatron_loop.hf.modeling_looplm.Recurrence`; this model
        passes in how a loop runs here (megatron-core blocks, recomputation, truncated backpropagation) and
        Huginn's per-step noise.
        """
        run = LoopOptions.of(options, fields)
        if isinstance(run.objective, ShortcutTrajectory):  # LoopFormer's full + short trajectory (shortcut.py)
            loss, logits = shortcut_objective(self, input_ids, labels, run)
            return LoopLMOutput(logits=logits, loss=loss)
        if run.exit_criterion != "none":
            self.tensor_parallel.check_exit(run.exit_criterion)
            check_exit(run.exit_criterion, run.exit_threshold, self.config.exit_gate, run.exit_mode)
            with torch.no_grad():  # exit decisions are not differentiable
                return self._forward(input_ids, labels, run)
        return self._forward(input_ids, labels, run)

    def _forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None, run: LoopOptions) -> LoopLMOutput:
        cfg = self.config
        r = cfg.train_loops if run.num_loops is None else int(run.num_loops)
        if run.loop_steps is not None:  # a trajectory: its number of steps (shortcut.py)
            r = len(run.loop_steps)
        if r < 1:
            raise LoopConfigError(f"num_loops={run.num_loops}: expected an integer >= 1")
        if run.backprop_loops is not None and int(run.backprop_loops) < 1:
            raise LoopConfigError(f"backprop_loops={run.backprop_loops}: expected None (all loops) or an integer >= 1")
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise LoopConfigError(f"input length {input_ids.shape[1]} exceeds model.max_position_embeddings="
                                  f"{cfg.max_position_embeddings}")
        grid = run.timestep_grid or cfg.timestep_grid
        psi_all = self.timestep_inputs(r, grid, input_ids.device, run.loop_steps) if self.uses_timestep else None

        h = self.tensor_parallel.embed(self.embed_tokens, input_ids)  # [s, b, d] ([s/N, b, d] sequence parallel)
        rope = self._rope(input_ids.shape[1], input_ids.device, h.dtype)
        for block in self.prelude:
            h = block(h, rope)

        # Truncated backpropagation: loops 0 .. detached-1 run without a graph; h_detached is a constant.
        detached = 0 if run.backprop_loops is None else max(r - int(run.backprop_loops), 0)
        # How each graphed loop runs (activation recomputation, when applied); detached loops keep nothing
        runners = None if self.recompute is None else self.recompute.loop_runners(r - detached, h)

        def step(loop: int, x, x0, psi, past) -> torch.Tensor:
            if loop < detached:
                with torch.no_grad():
                    return self.loop_iteration(x, x0, rope, psi, *past)
            if runners is None:
                return self.loop_iteration(x, x0, rope, psi, *past)
            return runners[loop - detached](self.loop_iteration, x, x0, rope, psi, *past)

        exit_rule = None
        if run.exit_criterion != "none":
            reading = ((lambda x: self.exit_gate(state_norm(self, x))) if run.exit_criterion == "q_exit"
                       else (lambda x: F.linear(state_norm(self, x), self.head_weight())))
            exit_rule = lambda x: TokenExit(run.exit_criterion, run.exit_threshold, x, reading, core=self.core,  # noqa: E731
                                            mode=run.exit_mode)
        # Ouro: the gate's logit after every loop; Stage I/II read every state h^1..h^r
        objective = run.objective if labels is not None and self.training else None
        loops = Recurrence(cfg, step, r, psi=psi_all, start=lambda x0: noise_state(cfg, x0, run.initial_state_seed),
                           exit_rule=exit_rule, keep_trajectory=run.return_trajectory,
                           keep_states=objective is not None or run.weighted_exit,
                           gate=None if self.exit_gate is None else (lambda x: self.exit_gate(state_norm(self, x))))
        h = self.coda_input(loops.run(h))
        if run.weighted_exit and objective is None:  # Ouro's expected logits over p(t|x) (exit_gate.py)
            try:
                logits, exit_pdf, loss = weighted_exit_output(self, loops.states, loops.exit_logits(), labels)
            except ValueError as e:
                raise LoopConfigError(str(e)) from None
            return LoopLMOutput(logits=logits, loss=loss, exit_pdf=exit_pdf)
        loss = None
        if objective is not None:  # Ouro's training objective; h: the head input at r
            loss, h = objective.loss(self, loops.states, loops.gate_logits, rope, labels)
        else:
            for block in self.coda:
                h = block(h, rope)
            h = self.tensor_parallel.head_input(output_norm(self, h)).transpose(0, 1)  # [b, s, d]
            if labels is not None:
                loss = self.loss(h, labels)
        logits = self.tensor_parallel.logits(h, self.head_weight()) if run.compute_logits else None
        trajectory = None if loops.trajectory is None else [self.tensor_parallel.gather_sequence(t).transpose(0, 1)
                                                              for t in loops.trajectory]
        exit_loops = None if loops.token_exit is None else loops.token_exit.loops.transpose(0, 1)
        gate_logits = loops.exit_logits()  # [s, b, r]
        exit_pdf = None if gate_logits is None else exit_distribution(gate_logits.transpose(0, 1))
        return LoopLMOutput(logits=logits, loss=loss, trajectory=trajectory, exit_loops=exit_loops, exit_pdf=exit_pdf,
                            hidden=h if run.return_hidden else None)

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (App. C.2) from final hidden states ``[b, s, d]``.

        Chunked over tokens (``self.loss_chunk_tokens`` at a time); equal to ``F.cross_entropy`` of
        the full fp32 logits (``loss.chunked_linear_cross_entropy``). ``model.loss_implementation``
        picks torch's fp32 chunks (CPU, the reference) or Liger-Kernel's fused kernel (CUDA).
        """
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        return chunked_linear_cross_entropy(h, self.head_weight(), labels[:, 1:].reshape(-1),
                                            chunk_size=self.loss_chunk_tokens, ignore_index=IGNORE_INDEX,
                                            implementation=self.tensor_parallel.loss_implementation(
                                                self.loss_implementation))


def build_model(config: ModelConfig, placement: ParallelPlacement | None = None, *,
                device: torch.device | str | None = None, fast_path: bool = True) -> LoopLM:
    """Build a LoopLM plain (CPU unless ``device`` is given; ``"meta"`` for shape-only dry runs): no process
    group is created and no global parallel state is touched. ``placement``: this rank's place in the
    tensor- and data-parallel grid (None: a single rank, TP = 1; at TP > 1 the caller owns megatron-core's
    groups, ``parallel.bootstrap.init_model_parallel``, which returns it). ``fast_path=False``: blocks of
    megatron-core's modules only (``layers.loop_block_spec``). The model is prepared for training
    separately (``parallel.parallelize``)."""
    if device is None:
        return LoopLM(config, placement, fast_path)
    with torch.device(device):
        return LoopLM(config, placement, fast_path)
