"""Activation checkpointing of the recurrent core (App. C.2 "Recurrent backpropagation").

Training backpropagates through all K loops, so without checkpointing the activations of
L(K) = p + K s + c blocks are alive at the end of the forward. ``model.activation_checkpointing``:

* ``none``      -- keep everything (fastest, most memory).
* ``per_loop``  -- recompute every loop but the last in backward; each checkpointed loop keeps
  only its input h_l, so the peak grows by one loop input per added loop (the memory law).
* ``selective`` -- every loop but the last keeps the outputs of its matmuls and attention and
  recomputes only norms, RoPE and elementwise work (PyTorch's
  ``create_selective_checkpoint_contexts``; torchtitan's selective "op" policy).
* ``auto``      -- per loop, the cheapest mix of none / selective / per_loop that fits
  ``activation_checkpointing_budget_gib`` (:func:`plan_loops`, memory model below).
* ``per_block`` -- recompute every block (prelude, core, coda; the least memory).

Gradients are identical in every mode (the model draws no random numbers, so regions neither
save nor restore RNG state). The last loop is never recomputed: backward would recompute it
first thing, so its peak would not drop while its cost would be paid.

Memory model (per token, bytes = activation itemsize x elements, eager blocks; exact on CPU
against ``perf.peak_memory_delta`` within the loss's transients, tests/test_perf_checkpointing.py).
For one block with width d, MLP width f, H query heads and G key/value heads of size e, batch b:

    none      5d + 5f + (H+2G)e + 2He + Ge + H + 2 + 4e/b   (+ H + G + 2He + Ge with QK-norm)
    selective 2d + 2f + (H+2G)e + He + H                    (matmul and attention outputs)

plus the block's output d in both (the embedding, prelude, coda, final norm and the loss's
chunk buffers are a fixed term; the parameter gradients bound the end of backward). A loop of s blocks keeps ``s x`` that in ``none`` and
``selective``, and only its output d when checkpointed (its input is the previous loop's output).
Compiled blocks keep less than ``none`` (fused elementwise chains), so the model is conservative
there. The planner puts checkpointed loops first, selective next, stored loops last, and bounds
both the end of the forward and each checkpointed loop's recomputation in backward (which brings
back a whole loop while the loops before it are still alive).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

NONE, SELECTIVE, FULL = "none", "selective", "full"  # what one loop keeps
MODES = ("none", "per_loop", "selective", "auto", "per_block")
LOOP_MODES = {"none": NONE, "per_loop": FULL, "selective": SELECTIVE}
# Recomputation cost of one loop relative to its forward: all of it when checkpointed, its
# non-matmul work (norms, RoPE, SwiGLU, residual adds) under the selective policy. 0.25 is an
# assumption for eager bf16 blocks at the paper's widths (memory-bound elementwise kernels);
# the checkpointing bench measures the real ratio (docs/BENCHMARKS.md).
RECOMPUTE_COST = {NONE: 0.0, SELECTIVE: 0.25, FULL: 1.0}
GIB = 2**30

_aten = torch.ops.aten
# Outputs kept by the selective policy: matmuls and every SDPA kernel (torchtitan's _save_list,
# plus the CPU flash kernel so that CPU runs exercise the same policy).
SAVED_OPS = frozenset(op for op in (
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    getattr(_aten, "_scaled_dot_product_fused_attention_overrideable", None) and
    _aten._scaled_dot_product_fused_attention_overrideable.default,
) if op is not None)


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save matmul and attention outputs, recompute everything else (norms, RoPE, elementwise)."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def run_checkpointed(kind: str, fn: Callable, *args):
    """``fn(*args)`` keeping what ``kind`` (none / selective / full) says for backward."""
    if kind == NONE:
        return fn(*args)
    context = {}
    if kind == SELECTIVE:
        context["context_fn"] = functools.partial(create_selective_checkpoint_contexts, selective_policy)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **context)


def run_loop(kind: str, owner, fn: Callable, *args):
    """One loop ``fn(*args)`` under ``kind``: a ``full`` loop is one checkpointed region; a
    ``selective`` loop runs its blocks with ``owner.selective_blocks`` set, each block applying
    the policy inside its own (possibly compiled) forward (``LoopBlock.forward``)."""
    if kind != SELECTIVE:
        return run_checkpointed(kind, fn, *args)
    owner.selective_blocks = True
    try:
        return fn(*args)
    finally:
        owner.selective_blocks = False


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


def block_elements_per_token(cfg, batch: int) -> tuple[float, float]:
    """(none, selective) elements one block keeps per token, its output included (module docstring)."""
    d, f, h, g, e = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                     cfg.head_dim)
    none = 5 * d + 5 * f + (h + 2 * g) * e + 2 * h * e + g * e + h + 2 + 4 * e / batch
    if cfg.qk_norm:
        none += h + g + 2 * h * e + g * e
    selective = 2 * d + 2 * f + (h + 2 * g) * e + h * e + h
    return none + d, selective + d


def loop_memory(cfg, batch: int, seq: int, itemsize: int, chunk_tokens: int, param_bytes: int = 0) -> LoopMemory:
    """The memory model of one training micro-batch ``[batch, seq]`` of ``cfg`` (bytes);
    ``param_bytes``: the trainable parameters, whose gradients exist at the end of backward."""
    tokens = batch * seq
    none, selective = block_elements_per_token(cfg, batch)
    per_elem = tokens * itemsize
    d, v = cfg.hidden_size, cfg.vocab_size
    cast = 0 if itemsize == 4 else itemsize  # low-precision copies next to fp32 buffers
    loss = (tokens * d * itemsize  # d loss / d hidden, formed in the forward
            + v * d * (4 + cast)  # fp32 head-gradient accumulator (and its cast)
            + min(chunk_tokens, tokens) * v * (8 + cast))  # one chunk: fp32 logits, logsumexp's temporary
    fixed = int((cfg.prelude_layers + cfg.coda_layers) * none * per_elem + 3 * d * per_elem + loss)
    return LoopMemory(none=int(cfg.core_layers * none * per_elem), selective=int(cfg.core_layers * selective * per_elem),
                      full=int(d * per_elem), fixed=fixed,
                      gradients=int(param_bytes + (v * d * itemsize if param_bytes else 0)))


def predicted_peak(kinds: Sequence[str], memory: LoopMemory) -> int:
    """Peak bytes of a step under a plan: the end of the forward, a checkpointed loop's
    recomputation in backward (the loops before it alive, the loop itself back in full), or the
    end of backward (every parameter gradient, activations gone) -- whichever is largest."""
    kept = [memory.of(k) for k in kinds]
    peak = max(memory.fixed + sum(kept), memory.gradients)
    for j, kind in enumerate(kinds):
        if kind != NONE:
            peak = max(peak, memory.fixed + sum(kept[:j]) + memory.none)
    return peak


@dataclass(frozen=True)
class LoopPlan:
    kinds: tuple[str, ...]
    peak_bytes: int
    cost: float  # recomputed loop-forwards
    fits: bool


def plan_loops(num_loops: int, memory: LoopMemory, budget_bytes: float | None) -> LoopPlan:
    """The cheapest per-loop plan (least recomputation) whose predicted peak fits the budget.

    Plans are ``[full] * a + [selective] * b + [none] * rest`` with the last loop never
    checkpointed; among equal costs the smaller peak wins. If nothing fits, the plan with the
    smallest peak (``per_loop``) is returned with ``fits=False``.
    """
    candidates = []
    for a in range(num_loops):
        for b in range(num_loops - a):
            kinds = (FULL,) * a + (SELECTIVE,) * b + (NONE,) * (num_loops - a - b)
            cost = sum(RECOMPUTE_COST[k] for k in kinds)
            peak = predicted_peak(kinds, memory)
            candidates.append(LoopPlan(kinds, peak, cost, budget_bytes is None or peak <= budget_bytes))
    fitting = [p for p in candidates if p.fits]
    if fitting:
        return min(fitting, key=lambda p: (p.cost, p.peak_bytes))
    return min(candidates, key=lambda p: (p.peak_bytes, p.cost))


def loop_kinds(mode: str, num_loops: int, plan: Callable[[], LoopPlan]) -> tuple[str, ...]:
    """What each of ``num_loops`` loops keeps under ``mode`` (``plan`` is asked only for ``auto``)."""
    if mode == "auto":
        return plan().kinds
    kind = LOOP_MODES.get(mode, NONE)  # per_block checkpoints blocks, not loops
    return (kind,) * (num_loops - 1) + (NONE,)


def default_budget_bytes(device: torch.device) -> float | None:
    """``activation_checkpointing_budget_gib: null``: on CUDA, 90 % of the device minus what is
    allocated now (parameters, gradients, optimizer state); elsewhere no limit."""
    if device.type != "cuda":
        return None
    free_total = torch.cuda.get_device_properties(device).total_memory
    return 0.9 * free_total - torch.cuda.memory_allocated(device)
