"""Prepare a built LoopLM for training: the one stage between ``build_model`` and ``build_engine``
(torchtitan's ``parallelize_*``, OLMo-core's ``parallelize_model``).

``model/looplm.py`` computes the paper's equations; the tensor-parallel layers it is built with are
those of its megatron-core spec (the TP size comes from the groups ``parallel.bootstrap`` made).
Everything else that changes how the built model executes for training is applied here, from
outside, in this order (:func:`parallelize`):

1. the TP sum of partial gradients (:func:`megatron_loop.parallel.grads.register_tp_gradient_sum`),
   inside backward, before DeepSpeed takes the gradients;
2. activation recomputation as ``model.recompute*`` asks (:func:`apply_recompute`,
   the policies of :mod:`megatron_loop.model.recompute`);
3. compiled blocks where :func:`compile_decision` says so (:func:`apply_compile`). Recomputation comes
   first: a recomputed block's forward is replaced on the instance and ``nn.Module.compile``
   compiles the module's call, so a compiled block traces its recomputed region (the selective
   policy included) with it;
4. under ZeRO-3, the registration of the parameters the model applies outside their owning
   submodule (the LM head in the chunked loss), so DeepSpeed gathers them for the root's forward.

Models built for inference, export or probes skip this stage: they run eager and keep every
activation their autograd needs. What this stage adds to a model is declared on it (``LoopLM.recompute``,
``compile_note``, ``tp_gradient_sum``) and set here only.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from megatron_loop.model.compat import make_megatron_compilable
from megatron_loop.model.recompute import ActivationRecompute, RecomputeSettings, PendingMemory
from megatron_loop.parallel.grads import register_tp_gradient_sum


def parallelize(model: nn.Module, zero_stage: int) -> str:
    """Apply steps 1-4 of the module docstring to ``model`` for a run at ZeRO ``zero_stage``; returns
    (and keeps as ``model.compile_note``) the line saying what runs compiled."""
    register_tp_gradient_sum(model)
    apply_recompute(model, RecomputeSettings.from_config(model.config))
    enabled, note = compile_decision(model.config, zero_stage)
    if enabled:
        apply_compile(model)
    if zero_stage == 3:
        register_external_parameters(model)
    model.compile_note = note
    return note


def apply_recompute(model: nn.Module, settings: RecomputeSettings) -> ActivationRecompute | None:
    """Make ``model`` keep what ``settings`` say for backward (replacing any earlier settings): its
    ``recompute`` and each block's forward wrapped. Gradients are identical in every mode; ``none``
    removes recomputation (returns None)."""
    blocks = model.blocks()
    for block in blocks:
        block.__dict__.pop("forward", None)  # the class's forward again
    if settings.mode == "none":
        model.recompute = None
        return None
    applied = ActivationRecompute(model, settings)
    for block in blocks:
        block.forward = applied.recomputed_forward(block)
    model.recompute = applied
    return applied


def count_pending_memory(model: nn.Module, pending: Callable[[], PendingMemory]) -> None:
    """Once the engine exists: let an ``auto`` schedule without a budget count what the training step will still
    allocate (the optimizer state of its first step, DeepSpeed's buckets: ``optim.memory.pending_training_memory``)."""
    if model.recompute is not None:
        model.recompute.pending_memory = pending


def register_external_parameters(model: nn.Module) -> None:
    """ZeRO 3 gathers a partitioned weight only around its owning module's forward/backward;
    weights the model applies elsewhere (``model.external_parameters()``, e.g. LoopLM's LM head
    in the chunked loss) are registered with the root module so it gathers them too."""
    from deepspeed.runtime.zero.partition_parameters import register_external_parameter

    for param in getattr(model, "external_parameters", list)():
        register_external_parameter(model, param)


ZERO3_HOOKS = "DeepSpeed's compiler-disabled parameter hooks"


def compile_decision(config, zero_stage: int) -> tuple[bool, str]:
    """Whether the blocks run compiled for training, and the line that says so.

    ``model.compile`` auto is on with CUDA (``ModelConfig.compile_enabled``). Under ZeRO-3,
    DeepSpeed's parameter-gathering hooks run around every submodule and are
    ``torch.compiler.disable``d, so a compiled block breaks into many graphs (15 graphs and 28
    breaks for one block's forward and backward on CPU, against one whole graph under ZeRO-1:
    tests/support/perf_scripts/zero_engine.py): ``auto`` is then off; ``true`` is kept (the user asked)
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
