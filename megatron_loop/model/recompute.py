"""Activation recomputation of the recurrent core (App. C.2 "Recurrent backpropagation").

Training backpropagates through all K loops, so without recomputation the activations of
L(K) = p + K s + c blocks are alive at the end of the forward. This module holds the policies, the
memory model, the auto scheduler and :class:`ActivationRecompute`, which makes a built model keep what they
say (each loop asks once per forward how it runs; each block's forward is wrapped). It is applied from
outside the model, by :func:`megatron_loop.parallel.parallelize.apply_recompute`; a model
built for inference, export or probes keeps every activation its autograd needs. ``model.recompute``:

* ``none``      -- keep everything (fastest, most memory).
* ``per_loop``  -- recompute every loop but the last in backward; each recomputed loop keeps
  only its input h_l, so the peak grows by one loop input per added loop (the memory law).
* ``selective`` -- every loop but the last keeps, per block, the outputs of every other matmul
  (the 1st and 3rd: the fused QKV and the fused gate/up projections) and of attention, and
  recomputes the rest: the attention output projection, the down projection, norms, RoPE and
  elementwise work. This is torchtitan's selective "op" policy (its ``_save_list`` and
  ``_custom_policy``: save ``aten.mm`` outputs except every second one, always save SDPA) on
  PyTorch's ``create_selective_checkpoint_contexts``. Its recomputation is the two recomputed
  matmuls plus elementwise work: ``recompute_selective_cost`` (null: the FLOP share
  of those two matmuls in a block's forward, :func:`selective_recompute_fraction`).
* ``auto``      -- per loop, the cheapest mix of none / selective / per_loop that fits
  ``recompute_budget_gib`` (:func:`schedule_loops`, memory model below). Without a
  budget on CUDA, the device's free memory with what the first optimizer step and DeepSpeed's
  gradient buckets will allocate counted (:func:`scheduling_budget`); each schedule records that
  (:class:`Budget`) and says it (:meth:`LoopSchedule.describe`).
* ``per_block`` -- recompute every block (prelude, core, coda; the least memory).

Gradients are identical in every mode (the model draws no random numbers, so regions neither
save nor restore RNG state). The last loop is never recomputed: backward would recompute it
first thing, so its peak would not drop while its cost would be paid.

Memory model (per token; exact on CPU against ``measure.memory.peak_memory_delta`` within the loss's
transients, in fp32 and bf16: tests/unit/model/test_recompute.py). For one block with width d, MLP
width f, H query heads and G key/value heads of size e, batch b, activation itemsize i:

    none      i (3d + 4f + (H+2G)e + 2He + Ge) + 4 (H + 2 + 3d)     in fp32 (i = 4)
              i (2d + 4f + (H+2G)e + 2He + Ge) + 4 (H + 2 + 4d)     in bf16 (i = 2)
              (+ 4 (H + G + He + Ge) with QK-norm, 4 (H + G + 2He + 2Ge) in bf16)
    selective i (2f + (H+2G)e + He) + 4H                  (QKV, gate/up and attention outputs)

The fp32 terms are the norms' reciprocal RMS, attention's log-sum-exp and the RMSNorms' fp32
work: in bf16 each norm keeps an fp32 copy of its input and its fp32 normalised tensor.
the block's output included in fp32 (in bf16 the next block's norm keeps its fp32 copy instead,
counted in 4d), for the block's fast path (``fast_path.py``: no copy of the SwiGLU up half, no
per-layer rotary tables, no query copy under QK-norm); the embedding, prelude, coda, final norm and the loss's
chunk buffers are a fixed term; the parameter gradients bound the end of backward). A loop of s blocks keeps ``s x`` that in ``none`` and
``selective``, and only its output d when recomputed (its input is the previous loop's output).
Compiled blocks keep less than ``none`` (fused elementwise chains), so the model is conservative
there. The auto scheduler puts recomputed loops first, selective next, stored loops last, and bounds
both the end of the forward and each recomputed loop's recomputation in backward (which brings
back a whole loop while the loops before it are still alive).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from megatron_loop.config.validation import RECOMPUTE_MODES
from megatron_loop.flops import block_forward_flops_per_token, selective_recompute_flops_per_token

NONE, SELECTIVE, FULL = "none", "selective", "full"  # what one loop keeps
MODES = RECOMPUTE_MODES  # model.recompute: the one list, the config's
LOOP_MODES = {"none": NONE, "per_loop": FULL, "selective": SELECTIVE}
# Recomputation cost of one loop relative to its forward: all of it when recomputed, nothing when
# stored; a selective loop's is ``recompute_selective_cost`` (selective_recompute_fraction).
RECOMPUTE_COST = {NONE: 0.0, FULL: 1.0}
GIB = 2**30

# torch is imported where the mechanism runs, not at the top: the memory model and the planner
# below are arithmetic on the config, which --dry-run's memory check (training/memory_plan.py)
# uses without paying for torch.
if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.checkpoint import CheckpointPolicy


@functools.cache
def policy_ops() -> tuple[frozenset, frozenset]:
    """(attention ops, matmul ops) of the selective policy (torchtitan's "op" policy): every SDPA
    kernel's output is kept (plus the CPU flash kernel, so that CPU runs exercise the same policy); of
    the matmuls, every other one in a block's op order (1st, 3rd, ...) is kept and the others are
    recomputed."""
    import torch

    aten = torch.ops.aten
    attention = frozenset(op for op in (
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        getattr(aten, "_scaled_dot_product_fused_attention_overrideable", None) and
        aten._scaled_dot_product_fused_attention_overrideable.default,
    ) if op is not None)
    return attention, frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})


def selective_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy for one recomputed region: keep attention outputs and the odd-numbered
    matmuls (counted apart in the forward and in the recomputation, which must decide alike),
    recompute everything else (torchtitan's ``_custom_policy``)."""
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls = {False: 0, True: 0}  # ctx.is_recompute -> matmuls seen
    attention_ops, matmul_ops = policy_ops()

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in attention_ops:
            return CheckpointPolicy.MUST_SAVE
        if op in matmul_ops:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_contexts():
    """``context_fn`` of a selective region (called once per region: a fresh matmul count)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(selective_policy())


def run_recomputed(kind: str, fn: Callable, *args):
    """``fn(*args)`` keeping what ``kind`` (none / selective / full) says for backward."""
    if kind == NONE:
        return fn(*args)
    from torch.utils.checkpoint import checkpoint

    context = {}
    if kind == SELECTIVE:
        context["context_fn"] = selective_contexts
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **context)


# ----------------------------------------------------------------------------- memory model


@dataclass(frozen=True)
class LoopMemory:
    """Bytes one loop keeps for backward under each kind, and the fixed rest of the step."""

    none: int
    selective: int
    full: int
    fixed: int  # prelude + coda blocks, embedding output, final norm, loss buffers
    gradients: int = 0  # parameter gradients alive at the end of backward (+ the embedding's transient)

    def of(self, kind: str) -> int:
        return {NONE: self.none, SELECTIVE: self.selective, FULL: self.full}[kind]


def block_bytes_per_token(cfg, batch: int, itemsize: int) -> tuple[float, float]:
    """(none, selective) bytes one block keeps per token, its output included (module docstring).

    Activations are ``itemsize`` bytes; the norms' reciprocal RMS and attention's log-sum-exp are
    always fp32, and the RMSNorms compute in fp32: in fp32 a norm keeps its normalised input (and
    the MLP norm its input, the attention residual), in bf16 each keeps an fp32 copy of its input
    and the normalised fp32 tensor (QK-norm likewise), which is why bf16 is not half of fp32."""
    d, f, h, g, e = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                     cfg.head_dim)
    low = itemsize < 4
    # norm outputs and (fp32) the block output, fused gate/up, silu(gate), its product, QKV, q, k, attention
    act = (2 if low else 3) * d + 4 * f + (h + 2 * g) * e + 2 * h * e + g * e
    fp32 = h + 2 + (4 * d if low else 3 * d)
    if cfg.qk_norm:  # the query is normalised as a view of the QKV output (kept anyway) in fp32
        fp32 += h + g + (2 * h * e + 2 * g * e if low else h * e + g * e)
    selective = itemsize * (2 * f + (h + 2 * g) * e + h * e + d) + 4 * h
    return itemsize * act + 4 * fp32, selective


def selective_recompute_fraction(cfg, seq: int) -> float:
    """FLOPs the selective policy recomputes per block (the attention output and down projections)
    over the block's forward FLOPs (``flops.block_forward_flops_per_token``): the default
    recomputation cost of a selective loop. Elementwise work is left out (no FLOP count says what
    it costs on a GPU; the benchmark measures the real ratio)."""
    return selective_recompute_flops_per_token(cfg) / block_forward_flops_per_token(cfg, seq)


def loop_memory(cfg, batch: int, seq: int, itemsize: int, chunk_tokens: int, param_bytes: int = 0) -> LoopMemory:
    """The memory model of one training micro-batch ``[batch, seq]`` of ``cfg`` (bytes), activations
    in ``itemsize`` bytes (4: fp32, 2: bf16); ``param_bytes``: the trainable parameters, whose
    gradients exist at the end of backward."""
    tokens = batch * seq
    none, selective = block_bytes_per_token(cfg, batch, itemsize)
    d, v = cfg.hidden_size, cfg.vocab_size
    predictions = batch * (seq - 1)  # the loss's tokens
    chunk = min(chunk_tokens, predictions)
    loss = (predictions * d * itemsize  # d loss / d hidden, formed in the forward
            + v * d * 4  # fp32 head-gradient accumulator
            # one chunk's fp32 logits and logsumexp's temporary; in low precision the accumulation of
            # the head gradient from the chunk's low-precision logits gradient (loss._accumulate_fp32)
            + max(8 * chunk * v, (itemsize * chunk * v + (itemsize + 4) * v * d) if itemsize < 4 else 0))
    # embedding output, final norm (fp32 copy and normalised tensor in low precision) and its output
    final = (3 * d * itemsize) if itemsize == 4 else (2 * d * itemsize + 2 * d * 4)
    fixed = int(((cfg.prelude_layers + cfg.coda_layers) * none + final) * tokens + loss)
    return LoopMemory(none=int(cfg.core_layers * none * tokens), selective=int(cfg.core_layers * selective * tokens),
                      full=int(d * itemsize * tokens), fixed=fixed,
                      gradients=int(param_bytes + (v * d * itemsize if param_bytes else 0)))


def predicted_peak(kinds: Sequence[str], memory: LoopMemory) -> int:
    """Peak bytes of a step under a schedule: the end of the forward, a recomputed loop's
    recomputation in backward (the loops before it alive, the loop itself back in full), or the
    end of backward (every parameter gradient, activations gone) -- whichever is largest."""
    kept = [memory.of(k) for k in kinds]
    peak = max(memory.fixed + sum(kept), memory.gradients)
    for j, kind in enumerate(kinds):
        if kind != NONE:
            peak = max(peak, memory.fixed + sum(kept[:j]) + memory.none)
    return peak


def step_activation_peak(cfg, mode: str, num_loops: int, batch: int, seq: int, itemsize: int, chunk_tokens: int,
                         budget: float | None = None, selective_cost: float | None = None) -> tuple[int, str]:
    """(predicted activation peak in bytes, the plan in words) of one training micro-batch
    ``[batch, seq]`` with ``num_loops`` loops that build a graph, under
    ``model.recompute`` = ``mode``: the plan a run makes (:func:`loop_kinds`; ``auto``
    plans against ``budget`` bytes as :func:`schedule_loops` does, None: no limit) and its
    :func:`predicted_peak` without the parameter gradients (the plan's memory check,
    training/memory_plan.py, counts those with the rest of the training state). ``per_block`` keeps
    each block occurrence's input and recomputes one block at a time in backward."""
    import dataclasses

    memory = loop_memory(cfg, batch, seq, itemsize, chunk_tokens)
    if mode == "per_block":
        outside = loop_memory(dataclasses.replace(cfg, prelude_layers=0, coda_layers=0), batch, seq, itemsize,
                              chunk_tokens)  # the loss, the final norm, the embedding output
        blocks = cfg.prelude_layers + num_loops * cfg.core_layers + cfg.coda_layers
        return outside.fixed + blocks * memory.full + memory.none // cfg.core_layers, "per_block"
    cost = selective_recompute_fraction(cfg, seq) if selective_cost is None else selective_cost
    kinds = loop_kinds(mode, num_loops, lambda: schedule_loops(num_loops, memory, budget, cost))
    counts = ", ".join(f"{k} x{kinds.count(k)}" for k in (FULL, SELECTIVE, NONE) if k in kinds)
    return predicted_peak(kinds, memory), f"{mode}: {counts}"


@dataclass(frozen=True)
class PendingMemory:
    """Bytes the training step will hold that are not allocated yet when a schedule is made (at the first
    forward): the optimizer state its first step creates and DeepSpeed's gradient buckets, allocated
    in backward (``optim/memory.py`` reads both from the optimizer and the engine)."""

    optimizer_state: int = 0
    buckets: int = 0


@dataclass(frozen=True)
class Budget:
    """What a schedule's activation budget was made of (bytes; the schedule's record of its assumptions)."""

    bytes: float | None  # None: no limit
    source: str  # "recompute_budget_gib", "device" or "none"
    device_total: int = 0
    allocated: int = 0
    pending: PendingMemory = PendingMemory()

    def describe(self) -> str:
        if self.source == "recompute_budget_gib":
            return f"budget {self.bytes / GIB:.2f} GiB (model.recompute_budget_gib)"
        if self.bytes is None:
            return "no memory limit (recompute_budget_gib: null off CUDA)"
        return (f"budget {self.bytes / GIB:.2f} GiB = {DEVICE_FRACTION:.0%} of {self.device_total / GIB:.2f} GiB "
                f"- {self.allocated / GIB:.2f} GiB allocated - {self.pending.optimizer_state / GIB:.2f} GiB optimizer "
                f"state not yet allocated - {self.pending.buckets / GIB:.2f} GiB DeepSpeed buckets "
                f"(gradients; ZeRO-3: prefetched parameters)")


DEVICE_FRACTION = 0.9  # of the device's memory a step may use (the rest: allocator fragmentation)


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(total, allocated) bytes of ``device``; None off CUDA (no limit there)."""
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.get_device_properties(device).total_memory, torch.cuda.memory_allocated(device)


def scheduling_budget(budget_gib: float | None, device: torch.device,
                    pending: Callable[[], PendingMemory] | None = None) -> Budget:
    """The activation budget of a schedule: ``recompute_budget_gib`` when given; else, on
    CUDA, 90 % of the device minus what is allocated now (parameters, master weights) minus what the
    step will still allocate (``pending``: optimizer state, gradient buckets); elsewhere no limit."""
    if budget_gib is not None:
        return Budget(budget_gib * GIB, "recompute_budget_gib")
    memory = device_memory(device)
    if memory is None:
        return Budget(None, "none")
    total, allocated = memory
    owed = pending() if pending is not None else PendingMemory()
    return Budget(DEVICE_FRACTION * total - allocated - owed.optimizer_state - owed.buckets, "device", total,
                  allocated, owed)


@dataclass(frozen=True)
class LoopSchedule:
    kinds: tuple[str, ...]
    peak_bytes: int
    cost: float  # recomputed loop-forwards
    fits: bool
    budget: Budget = Budget(None, "none")
    selective_cost: float = 0.0  # recomputation of one selective loop, in loop forwards

    def describe(self) -> str:
        """One line: the schedule, its predicted peak and cost, and what its budget assumed."""
        counts = ", ".join(f"{k} x{self.kinds.count(k)}" for k in (FULL, SELECTIVE, NONE) if k in self.kinds)
        fits = "" if self.fits else " (does not fit: the least memory there is)"
        return (f"activation recomputation auto over {len(self.kinds)} loops: {counts}{fits}; predicted peak "
                f"{self.peak_bytes / GIB:.2f} GiB, recomputing {self.cost:.2f} loop forwards (selective loop "
                f"{self.selective_cost:.2f}); {self.budget.describe()}")


def schedule_loops(num_loops: int, memory: LoopMemory, budget: float | Budget | None,
               selective_cost: float) -> LoopSchedule:
    """The cheapest per-loop schedule (least recomputation) whose predicted peak fits the budget.

    Schedules are ``[full] * a + [selective] * b + [none] * rest`` with the last loop never
    recomputed; a recomputed loop costs one loop forward, a selective one ``selective_cost``;
    among equal costs the smaller peak wins. If nothing fits, the schedule with the smallest peak
    (``per_loop``) is returned with ``fits=False``.
    """
    if not isinstance(budget, Budget):
        budget = Budget(budget, "none" if budget is None else "recompute_budget_gib")
    costs = {**RECOMPUTE_COST, SELECTIVE: selective_cost}
    candidates = []
    for a in range(num_loops):
        for b in range(num_loops - a):
            kinds = (FULL,) * a + (SELECTIVE,) * b + (NONE,) * (num_loops - a - b)
            cost = sum(costs[k] for k in kinds)
            peak = predicted_peak(kinds, memory)
            candidates.append(LoopSchedule(kinds, peak, cost, budget.bytes is None or peak <= budget.bytes, budget,
                                       selective_cost))
    fitting = [p for p in candidates if p.fits]
    if fitting:
        return min(fitting, key=lambda p: (p.cost, p.peak_bytes))
    return min(candidates, key=lambda p: (p.peak_bytes, p.cost))


def loop_kinds(mode: str, num_loops: int, schedule: Callable[[], LoopSchedule]) -> tuple[str, ...]:
    """What each of ``num_loops`` loops keeps under ``mode`` (``schedule`` is asked only for ``auto``)."""
    if mode == "auto":
        return schedule().kinds
    kind = LOOP_MODES.get(mode, NONE)  # per_block checkpoints blocks, not loops
    return (kind,) * (num_loops - 1) + (NONE,)


# ----------------------------------------------------------------------------- applied to a model


@dataclass(frozen=True)
class RecomputeSettings:
    """What activation recomputation should do (the module docstring describes the modes)."""

    mode: str = "none"  # none | per_loop | selective | auto | per_block
    budget_gib: float | None = None  # auto: the activation budget (None: the device's free memory)
    selective_cost: float | None = None  # a selective loop's recomputation (None: its FLOP share)

    @classmethod
    def from_config(cls, config) -> RecomputeSettings:
        """The settings ``model.recompute*`` asks for."""
        return cls(config.recompute, config.recompute_budget_gib,
                   config.recompute_selective_cost)


def _call(fn: Callable, *args):
    return fn(*args)


class ActivationRecompute:
    """Activation recomputation applied to one model (``model.recompute``).

    The model's forward asks :meth:`loop_runners` once per forward how each loop that builds a graph
    runs; each block's forward is wrapped (:meth:`block_kind` says what it keeps). ``auto`` schedules
    are made once per input shape, dtype, device and budget and kept here (:attr:`schedules`).
    """

    def __init__(self, model: nn.Module, settings: RecomputeSettings):
        self._model = weakref.ref(model)  # the model holds this object: no reference cycle
        self.settings = settings
        self.schedules: dict[tuple, LoopSchedule] = {}  # auto, per input shape
        self._schedules_to_report: list[str] = []  # new schedules' descriptions, for the training log
        # What the training step will still allocate when a schedule is made (optimizer state, DeepSpeed's
        # buckets): given once the engine exists (parallelize.count_pending_memory), counted by an ``auto``
        # schedule without a budget.
        self.pending_memory: Callable[[], PendingMemory] | None = None
        self.in_selective_loop = False  # while a selective loop runs, its blocks keep only matmul/attention outputs
        self._runners = {NONE: _call, FULL: self._run_full_loop, SELECTIVE: self._run_selective_loop}

    # -------------------------------------------------------------- loops
    def loop_runners(self, num_loops: int, hidden: torch.Tensor) -> list[Callable] | None:
        """One runner per loop that builds a graph, called as ``runner(loop_fn, *args)``; None without
        autograd (nothing is kept for backward then). ``hidden`` is ``[s, b, d]``."""
        import torch

        if not torch.is_grad_enabled():
            return None
        kinds = loop_kinds(self.settings.mode, num_loops, lambda: self._auto_schedule(num_loops, hidden))
        return [self._runners[kind] for kind in kinds]

    @staticmethod
    def _run_full_loop(fn: Callable, *args):
        return run_recomputed(FULL, fn, *args)

    def _run_selective_loop(self, fn: Callable, *args):
        """Each block of the loop applies the selective policy inside its own (possibly compiled)
        forward (:meth:`block_kind`): the policy counts matmuls per block."""
        self.in_selective_loop = True
        try:
            return fn(*args)
        finally:
            self.in_selective_loop = False

    def _auto_schedule(self, num_loops: int, hidden: torch.Tensor) -> LoopSchedule:
        model = self._model()
        s, b = hidden.shape[:2]
        key = (num_loops, b, s, hidden.dtype, hidden.device, self.settings.budget_gib)
        if key not in self.schedules:
            budget = scheduling_budget(self.settings.budget_gib, hidden.device, self.pending_memory)
            params = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters()
                         if p.requires_grad)  # ZeRO-3 partitions report their full size as ds_numel
            memory = loop_memory(model.config, b, s, hidden.element_size(), model.loss_chunk_tokens, params)
            cost = self.settings.selective_cost
            schedule = schedule_loops(num_loops, memory, budget,
                              selective_recompute_fraction(model.config, s) if cost is None else cost)
            self.schedules[key] = schedule
            self._schedules_to_report.append(f"{schedule.describe()} (micro-batch {b} x {s}, {hidden.dtype})")
        return self.schedules[key]

    def new_schedules(self) -> list[str]:
        """The descriptions of ``auto`` schedules made since the last call (each once, for the log)."""
        notes, self._schedules_to_report = self._schedules_to_report, []
        return notes

    # -------------------------------------------------------------- blocks
    def block_kind(self) -> str:
        """What the block running now keeps for backward."""
        import torch

        if not torch.is_grad_enabled():
            return NONE
        if self.settings.mode == "per_block":
            return FULL
        return SELECTIVE if self.in_selective_loop else NONE

    def recomputed_forward(self, block: nn.Module) -> Callable:
        """``block``'s own forward inside the region :meth:`block_kind` says. Recomputed regions draw
        no random numbers (no dropout anywhere), so RNG states are not saved per region."""
        forward = type(block).forward.__get__(block)

        def recomputed(hidden: torch.Tensor, rotary_pos_emb: torch.Tensor, psi: torch.Tensor | None = None):
            return run_recomputed(self.block_kind(), forward, hidden, rotary_pos_emb, psi)

        return recomputed


def new_loop_schedules(model: nn.Module) -> list[str]:
    """The ``auto`` schedules ``model`` made since the last call (for the training log)."""
    applied = getattr(model, "recompute", None)
    return applied.new_schedules() if applied is not None else []
