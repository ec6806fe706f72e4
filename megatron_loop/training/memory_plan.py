"""The memory a training step holds per rank, from the config alone, checked before anything is built.

A rank holds, in bytes, with P its parameters (``plan.count_parameters`` over the tensor-parallel
ranks, :func:`megatron_loop.parallel.per_rank.parameters_per_rank`), w the bytes of a weight (4 in fp32,
2 in bf16) and the ZeRO stage z over d data-parallel ranks (``optim/engine.py``, DeepSpeed's ZeRO):

    weights          P w                 (z = 3: / d)
    gradients        P w                 (z >= 2: / d; the fp32 accumulation of a bf16 run is not
                                          counted: a lower bound)
    master weights   4 P                 (z >= 1, / d: DeepSpeed's fp32 partitions, in fp32 runs too)
    optimizer state  4 (M + 2 A)         (z >= 1: / d) Muon's momentum for its M matrices, AdamW's two
                                          moments for the other A = P - M parameters (App. C.2)
    activations      the peak of one micro-batch under the run's recompute plan: the memory model and
                     the planner of :mod:`megatron_loop.model.recompute` (``step_activation_peak``), at
                     the loops that build a graph (``train.backprop_loops`` truncates), on this rank's
                     share of the heads and MLP columns (and of the sequence with sequence parallelism)

DeepSpeed's gradient buckets, allocator fragmentation and the CUDA context come on top: the sum is
what a step surely needs, so only a plan that surely cannot fit is refused.

Training checks it against the memory the rank trains in (:func:`check_fits_device`): one GPU's
memory, or on CPU the host's physical memory shared by the ranks of the host. ``auto`` recompute
plans there as the run will: on a GPU against what the state leaves of the device, on CPU without
a budget (no recomputation) unless ``model.recompute_budget_gib`` is set. The dry
run does not know where the run will train (it plans paper configs on a login node): it reports the
figures (:func:`rank_memory`, ``auto`` at its least memory) and warns when this host could not train
the plan on its CPU.
"""

from __future__ import annotations

import dataclasses
import os

from megatron_loop.config import Config, loop_range
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.errors import LoopConfigError
from megatron_loop.flops import block_matmul_params
from megatron_loop.model.loss_chunk import DEFAULT_CHUNK_TOKENS
from megatron_loop.model.recompute import GIB, step_activation_peak
from megatron_loop.parallel.per_rank import parameters_per_rank
from megatron_loop.plan import count_parameters, host_memory_bytes

PARTS = ("weights", "gradients", "master_weights", "optimizer_state", "activations")


def muon_parameters(cfg: Config) -> int:
    """Parameters Muon updates (one momentum buffer each): the block matrices, and the dense
    injection matrices with ``train.muon_conditioning_matrices`` (optim/optimizer.py)."""
    m, t = cfg.model, cfg.train
    if t.optimizer != "muon_adamw":
        return 0
    d = m.hidden_size
    dense = ((2 * d * d if m.initial_injection == "dense" else 0)
             + (m.history_window * d * d if m.history_injection == "dense" else 0))
    return m.physical_depth * block_matmul_params(m) + (dense if t.muon_conditioning_matrices else 0)


def graphed_loops(cfg: Config) -> int:
    """Loops of a step that keep activations for backward: K, or the largest sampled count (K when the
    draw is unbounded), cut to ``train.backprop_loops``."""
    t, k = cfg.train, cfg.model.train_loops
    high = loop_range(t, k)[1] or k
    return min(high, t.backprop_loops or high)


def rank_memory(cfg: Config, data_parallel: int, zero_stage: int, bf16: bool,
                activation_budget: float | None = 0.0) -> dict:
    """Bytes one rank holds in a training step (module docstring), by part, with ``total`` and the
    recompute ``plan``. ``activation_budget``: what ``auto`` recompute plans against (bytes; None:
    no limit, its cheapest plan; 0: its least memory)."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    tp, d = p.tensor_model_parallel_size, max(data_parallel, 1)
    params = parameters_per_rank(m, count_parameters(m).total, tp)
    muon = min(muon_parameters(cfg) // tp, params)
    w = 2 if bf16 else 4
    parts = {
        "weights": params * w // (d if zero_stage == 3 else 1),
        "gradients": params * w // (d if zero_stage >= 2 else 1),
        "master_weights": 4 * params // d if zero_stage >= 1 else 0,
        "optimizer_state": 4 * (muon + 2 * (params - muon)) // (d if zero_stage >= 1 else 1),
    }
    local = dataclasses.replace(m, num_attention_heads=max(m.num_attention_heads // tp, 1),
                                num_key_value_heads=max(m.num_key_value_heads // tp, 1),
                                intermediate_size=max(m.intermediate_size // tp, 1))
    seq = t.seq_length // tp if p.sequence_parallel else t.seq_length
    budget = activation_budget
    if m.recompute_budget_gib is not None:  # auto plans against the configured budget
        budget = m.recompute_budget_gib * GIB
    peak, plan = step_activation_peak(local, m.recompute, graphed_loops(cfg), t.micro_batch_size,
                                      seq, w, DEFAULT_CHUNK_TOKENS, budget, m.recompute_selective_cost)
    parts["activations"] = peak
    return {**parts, "total": sum(parts.values()), "plan": plan}


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def describe(cfg: Config, need: dict, data_parallel: int, zero_stage: int, bf16: bool) -> str:
    """The figures of :func:`rank_memory` in one clause, naming what each counts."""
    m, t = cfg.model, cfg.train
    return (f"model.vocab_size={m.vocab_size}, hidden_size={m.hidden_size}, {m.physical_depth} blocks "
            f"({count_parameters(m).total:,} parameters) with train.micro_batch_size={t.micro_batch_size} x "
            f"seq_length={t.seq_length} needs about {_gib(need['total'])} per rank: weights "
            f"{_gib(need['weights'])} ({'bf16' if bf16 else 'fp32'}), gradients {_gib(need['gradients'])}, fp32 "
            f"master weights {_gib(need['master_weights'])}, optimizer state {_gib(need['optimizer_state'])} "
            f"(Muon momentum + AdamW moments; ZeRO {zero_stage} over {data_parallel} data-parallel ranks), "
            f"activations {_gib(need['activations'])} (recompute {need['plan']}, "
            f"{graphed_loops(cfg)} loops with a graph)")


def host_ranks() -> int:
    """Ranks of this launch on this host (torchrun's LOCAL_WORLD_SIZE; else the world, as on CPU)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)


def check_fits_device(cfg: Config, data_parallel: int, zero_stage: int, bf16: bool, cuda: bool,
                      device_bytes: int | None = None) -> dict:
    """Refuse, before anything is built, a run whose step cannot fit the memory its ranks train in:
    one GPU (``device_bytes``: its total memory) or, on CPU, this host's physical memory
    (``plan.host_memory_bytes``) shared by :func:`host_ranks` ranks. Returns the figures."""
    memory = device_bytes if cuda else host_memory_bytes()
    if not memory:
        return {}
    ranks = 1 if cuda else host_ranks()
    # auto recompute plans as the run will (model/recompute.py: planning_budget): on a GPU against what
    # the state leaves of the device; on CPU with no limit unless a budget is configured
    state = rank_memory(cfg, data_parallel, zero_stage, bf16, activation_budget=None)
    budget = max(memory - (state["total"] - state["activations"]), 0) if cuda else None
    need = rank_memory(cfg, data_parallel, zero_stage, bf16, activation_budget=budget)
    if need["total"] * ranks > memory:
        where = (f"one GPU's {_gib(memory)}" if cuda else
                 f"this host's {_gib(memory)} of memory ({ranks} rank{'s' if ranks > 1 else ''} on it)")
        hint = ("; with recompute auto off CUDA set model.recompute_budget_gib to plan "
                "recomputation" if not cuda and cfg.model.recompute == "auto" else "")
        raise LoopConfigError(f"{describe(cfg, need, data_parallel, zero_stage, bf16)}, more than {where}; expected a "
                              "smaller model or micro-batch, more data-parallel ranks with ZeRO 2/3, more "
                              f"tensor-parallel ranks, or activation recomputation (model.recompute)"
                              f"{hint}")
    return need


def dry_run_memory(cfg: Config, data_parallel: int, zero_stage: int, precision: str) -> tuple[dict, list[str]]:
    """The dry run's ``memory_per_rank`` figures (``auto`` recompute at its least memory; precision
    ``auto``: bf16, the less) and a warning when this host's memory could not train the plan on its
    CPU (the dry run does not know where the run will train: training checks, :func:`check_fits_device`)."""
    bf16 = precision != "fp32"
    need = rank_memory(cfg, data_parallel, zero_stage, bf16)
    memory = host_memory_bytes()
    warnings = []
    if memory and need["total"] > memory:
        warnings.append(f"warning: {describe(cfg, need, data_parallel, zero_stage, bf16)}, more than this host's "
                        f"{_gib(memory)} of memory: training refuses it on this host's CPU; on GPUs it needs "
                        f"{_gib(need['total'])} per device")
    return need, warnings


def check_run_memory(cfg: Config, deepspeed: DeepSpeedSettings) -> dict:
    """:func:`check_fits_device` for the run about to start: the ZeRO stage and precision of its DeepSpeed
    settings (resolved once, with the device known: bf16 with CUDA under ``auto``), on this rank's GPU
    (``LOCAL_RANK``) or on the host's CPU."""
    import torch

    cuda = torch.cuda.is_available()
    device_bytes = None
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1)
        device_bytes = torch.cuda.get_device_properties(local).total_memory
    return check_fits_device(cfg, deepspeed.data_parallel_size, deepspeed.zero_stage, deepspeed.bf16, cuda,
                             device_bytes)
