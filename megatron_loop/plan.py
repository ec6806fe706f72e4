"""The training plan of a config: token budget, optimizer steps, WSD split, accumulation, data epochs.

The numbers the trainer runs and ``--dry-run`` prints, computed from the config alone (no torch,
no megatron-core), so that both import them from here.

The default token budget is the paper's Chinchilla rule (Sec. 2.2, App. C.1): 20 tokens per
parameter of the NonLoop model with L(K) layers (same backbone, no conditioning).
steps = tokens // (global_batch * seq_length); WSD split 5% / 85% / rest (App. C.2). The
accumulation steps follow from the batch sizes (App. C.2 "Gradient accumulation"):
global = micro x accumulation x data-parallel.

Parameters are counted analytically (:func:`count_parameters`, tested equal to
``build_model(cfg, device="meta").num_parameters()``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

from megatron_loop.config import Config, ModelConfig
from megatron_loop.errors import LoopConfigError
from megatron_loop.flops import block_matmul_params
from megatron_loop.optim.schedule import wsd_split

# psi(t, dt) of Eq. (timestep_features), as in model.conditioning (which imports torch);
# tests/unit/test_dryrun.py checks the counts against the built model.
NUM_TIMESTEP_FEATURES = 8
SHORTCUT_FREQUENCIES = 256  # LoopFormer's sinusoidal width of t and dt (hf/modeling_looplm.py ShortcutEmbedding)


class ParameterCount(NamedTuple):
    total: int  # every trainable parameter, conditioning included
    backbone: int  # without injection / timestep parameters


def nonloop_reference(model: ModelConfig) -> ModelConfig:
    """The NonLoop ``L(K)x1`` model of the same backbone, without conditioning (and with the paper's
    pre-norm blocks: Huginn's sandwich norms do not move the token budget of its pilot run)."""
    return dataclasses.replace(model, prelude_layers=0, coda_layers=0, core_layers=model.effective_depth(),
                               train_loops=1, initial_injection="none", history_injection="none", timestep="none",
                               block_norm="pre")


def count_parameters(cfg: ModelConfig) -> ParameterCount:
    """Trainable parameters of ``LoopLM(cfg)`` from the config alone (no model is built).

    Backbone: embedding V*d, per block the attention and SwiGLU matrices
    (:func:`megatron_loop.flops.block_matmul_params`), two RMSNorms of d and, for Qwen3, the
    q/k norms of head_dim (and Huginn's two sandwich norms of d, or Ouro's two branch-output norms, ``model.block_norm``); the final norm d; the LM head V*d unless tied. Conditioning (Sec. 5):
    initial-state injection 1 | 2d | 2d | 2d^2 (scalar | channel | residual_channel | dense),
    history injection w * (1 | d | d^2), Loop Gating 8, and per core layer two branches of
    Branch Gating 8 or AdaLN 2d x 8 each (LoopFormer's shortcut modulation: 2d x d + 2d each, and its
    embedding of (t, dt)); Ouro's learned exit gate d + 1.
    """
    d, w = cfg.hidden_size, cfg.history_window
    block = block_matmul_params(cfg) + 2 * d + (2 * cfg.head_dim if cfg.qk_norm else 0)
    block += 2 * d if cfg.block_norm in ("sandwich", "branch_output") else 0  # Huginn's / Ouro's two extra norms
    backbone = (cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2) + cfg.physical_depth * block + d)
    initial = {"none": 0, "scalar": 1, "channel": 2 * d, "residual_channel": 2 * d, "dense": 2 * d * d}
    history = {"none": 0, "scalar": w, "channel": w * d, "dense": w * d * d}
    per_branch = {"none": 0, "loop_gating": 0, "branch_gating": NUM_TIMESTEP_FEATURES,
                  "adaln": 2 * d * NUM_TIMESTEP_FEATURES, "shortcut": 2 * d * d + 2 * d}
    conditioning = (initial[cfg.initial_injection] + history[cfg.history_injection]
                    + (NUM_TIMESTEP_FEATURES if cfg.timestep == "loop_gating" else 0)
                    + cfg.core_layers * 2 * per_branch[cfg.timestep]
                    + (shortcut_embedding_parameters(d) if cfg.timestep == "shortcut" else 0)
                    + (d + 1 if cfg.exit_gate == "learned" else 0))  # Ouro's exit gate w [1, d], b [1]
    return ParameterCount(backbone + conditioning, backbone)


def shortcut_embedding_parameters(d: int) -> int:
    """LoopFormer's ShortcutEmbedding (hf/modeling_looplm.py): two MLPs 256 -> d -> d with biases."""
    return 2 * (SHORTCUT_FREQUENCIES * d + d + d * d + d)


def accumulation_steps(cfg: Config, data_parallel_size: int) -> int:
    """``global / (micro x data-parallel)``; an error naming the keys when it is not integral."""
    t = cfg.train
    per_step = t.micro_batch_size * data_parallel_size
    if t.global_batch_size % per_step:
        raise LoopConfigError(
            f"train.global_batch_size={t.global_batch_size}: expected a multiple of train.micro_batch_size="
            f"{t.micro_batch_size} x data-parallel size {data_parallel_size} = {per_step} "
            "(accumulation steps = global / (micro x data-parallel) must be an integer)")
    return t.global_batch_size // per_step


def training_plan(cfg: Config) -> dict:
    """Token budget, steps and WSD split of a run (the numbers the trainer uses)."""
    t = cfg.train
    tokens_per_step = t.global_batch_size * t.seq_length
    if t.max_steps is not None:
        steps = t.max_steps
        tokens = steps * tokens_per_step
    else:
        if t.train_tokens is not None:
            tokens = t.train_tokens
        else:
            tokens = int(t.tokens_per_parameter * count_parameters(nonloop_reference(cfg.model)).backbone)
        steps = tokens // tokens_per_step
    warmup, stable, decay = wsd_split(steps, t.warmup_fraction, t.stable_fraction) if steps else (0, 0, 0)
    return dict(train_tokens=tokens, train_steps=steps, warmup_steps=warmup, stable_steps=stable, decay_steps=decay)


def check_train_steps(cfg: Config, steps: int) -> int:
    """At least one optimizer step in the token budget, and a plan this host can hold
    (:func:`check_fits_host`)."""
    if steps < 1:
        t = cfg.train
        raise LoopConfigError(
            f"train.train_tokens={t.train_tokens}: less than one global batch of "
            f"{t.global_batch_size} x {t.seq_length} tokens; expected at least one step")
    check_fits_host(cfg, steps)
    return steps


# Bytes per training sample of the data plan the loaders build (data/blend.py, data/packed.py): the
# blend's dataset index (int16) and sample index (int64), the packing index's document and offset
# (int64 each) and the sample starts it is computed from (int64): 34, rounded down so that only a
# plan that surely cannot fit is refused.
INDEX_BYTES_PER_SAMPLE = 32
# The model is built in fp32 on the host before the engine moves it (model.build_model).
PARAMETER_BYTES = 4


def host_memory_bytes() -> int | None:
    """Physical memory of this host (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_fits_host(cfg: Config, steps: int, memory: int | None = None) -> None:
    """Refuse, before anything is built, a plan whose data index (``steps x global_batch_size``
    samples, :data:`INDEX_BYTES_PER_SAMPLE` each) or whose parameters (:func:`count_parameters`
    over the tensor-parallel ranks, fp32) need more than the host's physical memory ``memory``
    (default: :func:`host_memory_bytes`). These are the numbers ``--dry-run`` prints."""
    memory = host_memory_bytes() if memory is None else memory
    if not memory:
        return
    t, m = cfg.train, cfg.model
    gib = 2**30
    samples = steps * t.global_batch_size
    if samples * INDEX_BYTES_PER_SAMPLE > memory:
        given = f"train.max_steps={t.max_steps}" if t.max_steps is not None else f"{steps:,} steps"
        raise LoopConfigError(
            f"{given} x train.global_batch_size={t.global_batch_size} = {samples:,} samples: the data plan's index "
            f"needs about {samples * INDEX_BYTES_PER_SAMPLE / gib:,.0f} GiB ({INDEX_BYTES_PER_SAMPLE} bytes per "
            f"sample), more than this host's {memory / gib:,.0f} GiB of memory; expected fewer steps or a smaller "
            "global batch")
    tp = cfg.parallel.tensor_model_parallel_size
    params = count_parameters(m).total
    if params // tp * PARAMETER_BYTES > memory:
        raise LoopConfigError(
            f"model.vocab_size={m.vocab_size}, hidden_size={m.hidden_size}, {m.physical_depth} blocks: "
            f"{params:,} parameters ({params // tp:,} per tensor-parallel rank) need "
            f"{params // tp * PARAMETER_BYTES / gib:,.0f} GiB in fp32, more than this host's {memory / gib:,.0f} GiB "
            "of memory; expected a smaller model (or more tensor-parallel ranks)")


def total_train_steps(cfg: Config) -> int:
    """The optimizer steps a run trains (an error when the budget holds less than one)."""
    return check_train_steps(cfg, training_plan(cfg)["train_steps"])


# megatron-core's DType codes (indexed_dataset.DType) -> bytes per token; read here without
# importing megatron-core, which --dry-run never pays for.
_TOKEN_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
_IDX_DTYPE_OFFSET = 9 + 8  # magic MMIDIDX\x00\x00, version u64, then the dtype code u8


def prefix_tokens(prefix: str) -> int | None:
    """Tokens in ``P.bin`` from its size and the token width ``P.idx`` records; None when the header
    is unreadable (training reports a damaged index with its own message)."""
    try:
        with open(f"{prefix}.idx", "rb") as f:
            f.seek(_IDX_DTYPE_OFFSET)
            code = f.read(1)
        return os.path.getsize(f"{prefix}.bin") // _TOKEN_BYTES[code[0]]
    except (OSError, IndexError, KeyError):
        return None


def data_epochs(cfg: Config, train_steps: int) -> dict[str, float]:
    """Epochs of each train prefix the plan reads: its share of the samples (by ``data.train_weights``)
    times ``seq_length`` over its tokens, as the training log reports them."""
    d, t = cfg.data, cfg.train
    weights = d.train_weights or [1.0] * len(d.train_prefixes)
    samples = train_steps * t.global_batch_size
    epochs = {}
    for prefix, weight in zip(d.train_prefixes, weights):
        tokens = prefix_tokens(prefix)
        if tokens:
            epochs[prefix] = samples * weight / sum(weights) * t.seq_length / tokens
    return epochs
