"""How a built LoopLM executes for training: activation checkpointing and compilation, applied from
outside the model after it is built (torchtitan's ``apply_ac`` / ``apply_compile``).

``looplm.py`` computes the paper's equations only. This module is the one place that decides what
each loop keeps for backward (:func:`apply_activation_checkpointing`, the plan given as data:
:class:`CheckpointingPlan`) and which blocks run compiled (:func:`compile_decision`,
:func:`apply_compile`); :func:`prepare_for_training` applies both as ``model.*`` asks, for the ZeRO
stage the engine runs (``optim.build_engine`` calls it). Models built for inference, export or
probes run eager and keep every activation their autograd needs.

Order: checkpointing first, then compilation. A checkpointed block's forward is replaced on the
instance; ``nn.Module.compile`` compiles the module's call, which calls that forward, so a compiled
block traces its checkpointed region (the selective policy included) with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from megatron_loop.model.checkpointing import (FULL, NONE, SELECTIVE, LoopPlan, PendingMemory, loop_kinds,
                                               loop_memory, plan_loops, planning_budget, run_checkpointed,
                                               selective_recompute_fraction)
from megatron_loop.model.compat import make_megatron_compilable


@dataclass(frozen=True)
class CheckpointingPlan:
    """What activation checkpointing should do (``model/checkpointing.py`` describes the modes)."""

    mode: str = "none"  # none | per_loop | selective | auto | per_block
    budget_gib: float | None = None  # auto: the activation budget (None: the device's free memory)
    selective_cost: float | None = None  # a selective loop's recomputation (None: its FLOP share)

    @classmethod
    def from_config(cls, config) -> CheckpointingPlan:
        """The plan ``model.activation_checkpointing*`` asks for."""
        return cls(config.activation_checkpointing, config.activation_checkpointing_budget_gib,
                   config.activation_checkpointing_selective_cost)


def _call(fn: Callable, *args):
    return fn(*args)


class ActivationCheckpointing:
    """Activation checkpointing applied to one model (``model.checkpointing``).

    The model's forward asks :meth:`loop_runners` once per forward how each loop that builds a graph
    runs; each block's forward is wrapped (:meth:`block_kind` says what it keeps). ``auto`` plans are
    made once per input shape, dtype, device and budget and kept here (:attr:`plans`).
    """

    def __init__(self, model: nn.Module, plan: CheckpointingPlan):
        self._model = weakref.ref(model)  # the model holds this object: no reference cycle
        self.plan = plan
        self.plans: dict[tuple, LoopPlan] = {}  # auto, per input shape
        self._plans_to_report: list[str] = []  # new plans' descriptions, for the training log
        # What the training step will still allocate when a plan is made (optimizer state, DeepSpeed's
        # buckets): set by optim.build_engine, counted by an ``auto`` plan without a budget.
        self.pending_memory: Callable[[], PendingMemory] | None = None
        self.in_selective_loop = False  # while a selective loop runs, its blocks keep only matmul/attention outputs
        self._runners = {NONE: _call, FULL: self._run_full_loop, SELECTIVE: self._run_selective_loop}

    # -------------------------------------------------------------- loops
    def loop_runners(self, num_loops: int, hidden: torch.Tensor) -> list[Callable] | None:
        """One runner per loop that builds a graph, called as ``runner(loop_fn, *args)``; None without
        autograd (nothing is kept for backward then). ``hidden`` is ``[s, b, d]``."""
        if not torch.is_grad_enabled():
            return None
        kinds = loop_kinds(self.plan.mode, num_loops, lambda: self._auto_plan(num_loops, hidden))
        return [self._runners[kind] for kind in kinds]

    @staticmethod
    def _run_full_loop(fn: Callable, *args):
        return run_checkpointed(FULL, fn, *args)

    def _run_selective_loop(self, fn: Callable, *args):
        """Each block of the loop applies the selective policy inside its own (possibly compiled)
        forward (:meth:`block_kind`): the policy counts matmuls per block."""
        self.in_selective_loop = True
        try:
            return fn(*args)
        finally:
            self.in_selective_loop = False

    def _auto_plan(self, num_loops: int, hidden: torch.Tensor) -> LoopPlan:
        model = self._model()
        s, b = hidden.shape[:2]
        key = (num_loops, b, s, hidden.dtype, hidden.device, self.plan.budget_gib)
        if key not in self.plans:
            budget = planning_budget(self.plan.budget_gib, hidden.device, self.pending_memory)
            params = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters()
                         if p.requires_grad)  # ZeRO-3 partitions report their full size as ds_numel
            memory = loop_memory(model.config, b, s, hidden.element_size(), model.loss_chunk_tokens, params)
            cost = self.plan.selective_cost
            plan = plan_loops(num_loops, memory, budget,
                              selective_recompute_fraction(model.config, s) if cost is None else cost)
            self.plans[key] = plan
            self._plans_to_report.append(f"{plan.describe()} (micro-batch {b} x {s}, {hidden.dtype})")
        return self.plans[key]

    def new_plans(self) -> list[str]:
        """The descriptions of ``auto`` plans made since the last call (each once, for the log)."""
        notes, self._plans_to_report = self._plans_to_report, []
        return notes

    # -------------------------------------------------------------- blocks
    def block_kind(self) -> str:
        """What the block running now keeps for backward."""
        if not torch.is_grad_enabled():
            return NONE
        if self.plan.mode == "per_block":
            return FULL
        return SELECTIVE if self.in_selective_loop else NONE

    def checkpointed_forward(self, block: nn.Module) -> Callable:
        """``block``'s own forward inside the region :meth:`block_kind` says. Checkpointed regions draw
        no random numbers (no dropout anywhere), so RNG states are not saved per region."""
        forward = type(block).forward.__get__(block)

        def checkpointed(hidden: torch.Tensor, rotary_pos_emb: torch.Tensor, psi: torch.Tensor | None = None):
            return run_checkpointed(self.block_kind(), forward, hidden, rotary_pos_emb, psi)

        return checkpointed


def apply_activation_checkpointing(model: nn.Module, plan: CheckpointingPlan) -> ActivationCheckpointing | None:
    """Make ``model`` keep what ``plan`` says for backward (replacing any earlier plan). Gradients
    are identical in every mode; ``none`` removes checkpointing (returns None)."""
    blocks = model.blocks()
    for block in blocks:
        block.__dict__.pop("forward", None)  # the class's forward again
    if plan.mode == "none":
        model.checkpointing = None
        return None
    applied = ActivationCheckpointing(model, plan)
    for block in blocks:
        block.forward = applied.checkpointed_forward(block)
    model.checkpointing = applied
    return applied


def new_checkpoint_plans(model: nn.Module) -> list[str]:
    """The ``auto`` plans ``model`` made since the last call (for the training log)."""
    applied = getattr(model, "checkpointing", None)
    return applied.new_plans() if applied is not None else []


# ----------------------------------------------------------------------------- compilation

ZERO3_HOOKS = "DeepSpeed's compiler-disabled parameter hooks"


def compile_decision(config, zero_stage: int) -> tuple[bool, str]:
    """Whether the blocks run compiled for training, and the line that says so.

    ``model.compile`` auto is on with CUDA (``ModelConfig.compile_enabled``). Under ZeRO-3,
    DeepSpeed's parameter-gathering hooks run around every submodule and are
    ``torch.compiler.disable``d, so a compiled block breaks into many graphs (15 graphs and 28
    breaks for one block's forward and backward on CPU, against one whole graph under ZeRO-1:
    tests/perf_scripts/zero_engine.py): ``auto`` is then off; ``true`` is kept (the user asked)
    and the line says what it costs.
    """
    if not config.compile_enabled:
        return False, f"model.compile={config.compile}: off"
    if zero_stage == 3 and config.compile == "auto":
        return False, f"model.compile=auto: off under ZeRO-3 ({ZERO3_HOOKS} would split each block into many graphs)"
    note = f"model.compile={config.compile}: each block compiled once (one graph per block kind)"
    if zero_stage == 3:
        note += f"; under ZeRO-3 {ZERO3_HOOKS} split each block into many graphs (compile: auto would turn it off)"
    return True, note


def apply_compile(model: nn.Module, backend: str | Callable = "inductor", **options) -> None:
    """Compile each block's forward in place (``nn.Module.compile``), static shapes.

    Blocks of one model share their forward code; dynamo lifts their parameters to graph inputs
    (``inline_inbuilt_nn_modules``), so every block occurrence -- every layer of the shared core at
    every loop -- reuses one compiled graph per (shapes, psi present, grad mode, checkpoint kind).
    The loop itself stays in Python: running the shared core r times reuses the same graphs for any
    r, with no recompilation when r changes.
    """
    make_megatron_compilable()
    for block in model.blocks():
        block.compile(backend=backend, dynamic=False, **options)


def prepare_for_training(model: nn.Module, zero_stage: int) -> str:
    """Apply ``model.activation_checkpointing*`` and, where :func:`compile_decision` says so,
    compilation; returns (and keeps as ``model.compile_note``) the line saying what runs compiled."""
    apply_activation_checkpointing(model, CheckpointingPlan.from_config(model.config))
    enabled, note = compile_decision(model.config, zero_stage)
    if enabled:
        apply_compile(model)
    model.compile_note = note
    return note
