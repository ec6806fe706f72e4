"""DeepSpeed engine construction for the paper's optimizer (App. C.2).

Mechanism: we shard Muon ourselves. :class:`~megatron_loop.optim.optimizer.MuonAdamW` is a
plain torch optimizer handed to ``deepspeed.initialize`` (``zero_allow_untested_optimizer``);
ZeRO 1/2/3 flatten and partition its two groups as for any optimizer, reduce and clip the RAW
gradients with one global norm (which the engine reports), then call our ``step`` on the flat
fp32 partitions. After ``initialize`` we read ZeRO's own bookkeeping (flat offsets, partition
sizes, stage-3 sub-groups) into one :class:`~megatron_loop.optim.partitions.ZeroPartition` per
partition, registered with the optimizer, so Muon can all-gather its Newton-Schulz input back to
whole matrices. Momentum and AdamW moments stay sharded on the partitions.
DeepSpeed's built-in Muon is not used at all, which sidesteps its traps: name-based tagging that
overwrites flags (DeepSpeed#8438), SGD at stage 0 (#8441), clipping of the orthogonalised update
(#8439), the stage-3 reduce_scatter restriction, the torch.compiled Newton-Schulz, and bf16
momentum on resume (#7746, #8433: our momentum lives on ZeRO's fp32 master partition and torch's
``load_state_dict`` casts state to its dtype). The learning rate is a ``LambdaLR`` given to
``deepspeed.initialize`` (DeepSpeed's WarmupLR would overwrite per-group rates).

Stage 0 (no ZeRO) is supported in fp32: the optimizer then sees whole weights and clips the raw
gradients itself (DeepSpeed's own clip at stage 0 does not report the norm).

Precision (bf16): weights and activations in bf16, master weights and optimizer states in fp32,
and the micro-batch gradients summed in fp32, across micro-batches and across ranks, as
Megatron-LM's fp32 ``main_grad`` (its bf16 runs accumulate and all-reduce in fp32). DeepSpeed
0.19 sums them in bf16 unless the JSON sets ``data_types.grad_accum_dtype``; with ``"fp32"`` it
builds ``BF16_Optimizer`` at ZeRO 1 (an fp32 buffer of the whole gradient, all-reduced at the
boundary; ``bf16.immediate_grad_update`` adds each bf16 gradient to it as soon as autograd has
it and frees it, so no bf16 copy lives across micro-batches) and keeps ``DeepSpeedZeroOptimizer`` (ZeRO 2) / ``DeepSpeedZeroOptimizer_Stage3``
(ZeRO 3) with an fp32 gradient partition that every micro-batch's reduced gradient is added to.
``communication_data_type`` sets the dtype of that reduction (DeepSpeed's bf16 default would
sum the ranks' gradients in bf16). The shipped configs set both to fp32; a bf16 run whose JSON
leaves the accumulation dtype unset is refused (:func:`~megatron_loop.config.deepspeed.check_precision`). Stage 0 stays fp32
only: without ZeRO, DeepSpeed 0.19 raises NotImplementedError for bf16 weights with fp32
accumulation (``_do_optimizer_sanity_check``) and would otherwise wrap bf16 in its own optimizer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from megatron_loop.config import OptimizerSettings
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.errors import LoopConfigError
from megatron_loop.optim.partitions import ZeroPartition
from megatron_loop.optim.optimizer import MuonAdamW, role_param_groups
from megatron_loop.optim.schedule import wsd_scheduler
from megatron_loop.parallel.mpu import data_parallel_size, model_parallel_unit


class EngineParts(NamedTuple):
    engine: Any  # deepspeed.DeepSpeedEngine
    optimizer: MuonAdamW  # the base optimizer: param_groups[i]["name"] / ["lr"] for logging
    scheduler: torch.optim.lr_scheduler.LambdaLR


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings, *, clip_in_optimizer: bool) -> MuonAdamW:
    """``MuonAdamW`` over ``model``'s role groups; it clips raw gradients itself only when
    ``clip_in_optimizer`` (whole weights: no DeepSpeed or ZeRO stage 0)."""
    return MuonAdamW(
        role_param_groups(model, settings.optimizer, settings.muon_conditioning_matrices),
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        betas=(settings.adam_beta1, settings.adam_beta2),
        eps=settings.adam_eps,
        momentum=settings.muon_momentum,
        nesterov=settings.muon_nesterov,
        ns_steps=settings.muon_ns_steps,
        muon_scale=settings.muon_scale,
        clip_grad=settings.grad_clip if clip_in_optimizer and settings.grad_clip > 0 else None,
    )


def accumulation_dtype(zero_optimizer: Any) -> torch.dtype:
    """The dtype DeepSpeed's optimizer wrapper sums the micro-batch gradients in, read from what it built."""
    if hasattr(zero_optimizer, "fp32_groups_gradients_flat"):  # BF16_Optimizer: the whole-gradient buffers
        return zero_optimizer.fp32_groups_gradients_flat[0].dtype
    if getattr(zero_optimizer, "grad_partitions_flat_buffer", None) is not None:  # ZeRO 3
        return zero_optimizer.grad_partitions_flat_buffer.dtype
    if hasattr(zero_optimizer, "gradient_accumulation_dtype"):  # ZeRO 1/2: buffers are built at the first backward
        return zero_optimizer.gradient_accumulation_dtype
    return next(p.dtype for group in zero_optimizer.param_groups for p in group["params"])  # no wrapper


def describe_precision(engine: Any) -> str:
    """One log line: the precision of weights, gradient accumulation and reduction, and DeepSpeed's wrapper."""
    wrapper = f"DeepSpeed {type(engine.optimizer).__name__}, ZeRO stage {engine.zero_optimization_stage()}"
    if not engine.bfloat16_enabled():
        return f"precision: fp32 ({wrapper})"
    def name(dtype: torch.dtype) -> str:
        return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype, str(dtype))

    accumulation, reduction = name(accumulation_dtype(engine.optimizer)), name(engine.communication_data_type)
    return (f"precision: bf16 weights and activations, fp32 master weights and optimizer states; micro-batch "
            f"gradients accumulated in {accumulation}, reduced across ranks in {reduction} ({wrapper})")


def attach_zero_layouts(zero_optimizer: Any, optimizer: MuonAdamW) -> int:
    """Give ``optimizer`` a :class:`ZeroPartition` for every fp32 partition of ``zero_optimizer``
    (DeepSpeed's ZeRO 1/2/3 or BF16 wrapper around it).

    Reads DeepSpeed's own bookkeeping; returns the number of partitions tagged. Layouts are
    attached to all partitions (AdamW ignores them: its maths is elementwise).
    """
    if hasattr(zero_optimizer, "fp32_partitioned_groups_flat"):  # stage 3
        count = 0
        for index, flat in enumerate(zero_optimizer.fp32_partitioned_groups_flat):
            params = zero_optimizer.fp16_groups[index]
            layout = ZeroPartition.striped(
                params,
                [p.ds_shape for p in params],
                [p.partition_numel() for p in params],
                zero_optimizer.sub_group_process_groups[index],
            )
            optimizer.set_partition(flat, layout)
            count += 1
        return count
    if hasattr(zero_optimizer, "fp32_groups_flat_partition"):  # BF16_Optimizer (bf16, ZeRO 1, fp32 accumulation)
        for index, flat in enumerate(zero_optimizer.fp32_groups_flat_partition):
            # the group's bf16 weights back to back (no per-weight padding, the alignment padding
            # at the end), cut into equal partitions: BF16_Optimizer._setup_for_real_optimizer
            params = zero_optimizer.bf16_groups[index]
            offsets = [sum(p.numel() for p in params[:j]) for j in range(len(params))]
            partition = flat.numel()
            layout = ZeroPartition.contiguous(
                params, [p.shape for p in params], offsets, partition, zero_optimizer.real_dp_process_group[index]
            )
            optimizer.set_partition(flat, layout)
        return len(zero_optimizer.fp32_groups_flat_partition)
    if hasattr(zero_optimizer, "single_partition_of_fp32_groups"):  # stage 1/2
        for index, flat in enumerate(zero_optimizer.single_partition_of_fp32_groups):
            layout = ZeroPartition.contiguous(
                zero_optimizer.round_robin_bit16_groups[index],
                [meta.shape for meta in zero_optimizer.round_robin_bit16_meta[index]],
                zero_optimizer.round_robin_bit16_offsets[index],
                int(zero_optimizer.partition_size[index]),
                zero_optimizer.real_dp_process_group[index],
            )
            optimizer.set_partition(flat, layout)
        return len(zero_optimizer.single_partition_of_fp32_groups)
    raise TypeError(f"not a DeepSpeed ZeRO optimizer: {type(zero_optimizer).__name__}")


def build_engine(
    model: torch.nn.Module,
    settings: OptimizerSettings,
    deepspeed_settings: DeepSpeedSettings,
    *,
    total_steps: int,
) -> EngineParts:
    """The DeepSpeed engine, base optimizer and WSD scheduler for ``model``.

    Training loop contract: ``loss = ...engine(batch)...; engine.backward(loss); engine.step()``
    per micro-batch. ``engine.backward`` divides the loss by the accumulation (App. C.2), the engine
    steps the optimizer and scheduler at each accumulation boundary
    (``engine.is_gradient_accumulation_boundary()``), and ``engine.get_global_grad_norm()`` is the
    raw-gradient norm before clipping. ``engine.save_checkpoint`` / ``load_checkpoint`` carry the
    Muon momentum, AdamW moments and the scheduler.

    ``deepspeed_settings`` is the start's DeepSpeed JSON, read and resolved once
    (:class:`~megatron_loop.config.deepspeed.DeepSpeedSettings`: batch sizes, clipping, precision,
    ZeRO stage); nothing here reads or re-resolves it. ``model`` comes prepared for training
    (:func:`megatron_loop.parallel.parallelize.parallelize`, for the same ZeRO stage), in a world that
    exists (:func:`megatron_loop.parallel.bootstrap.init_world`) whose data-parallel size is the one the
    settings were resolved for. This is the one place ``deepspeed.initialize`` is called.
    """
    if not isinstance(deepspeed_settings, DeepSpeedSettings):
        raise TypeError(f"build_engine takes the DeepSpeed settings as one DeepSpeedSettings (read and resolved "
                        f"once: megatron_loop.config.deepspeed.DeepSpeedSettings.of_run or .resolve), not "
                        f"{type(deepspeed_settings).__name__}")
    if not dist.is_initialized():
        raise LoopConfigError("build_engine needs torch.distributed initialised first "
                              "(megatron_loop.parallel.bootstrap.init_world)")
    ds = deepspeed_settings
    # ZeRO shards over the data-parallel group only (world / TP): the batch arithmetic was resolved for it
    if ds.data_parallel_size != data_parallel_size() or float(settings.grad_clip) != ds.grad_clip:
        raise ValueError(  # a caller's mistake, not a config's: training resolves them for its own world
            f"build_engine: the DeepSpeed settings were resolved for data-parallel size {ds.data_parallel_size} "
            f"and grad_clip {ds.grad_clip}; this world has {data_parallel_size()} and the optimizer clips at "
            f"{settings.grad_clip}")
    config = ds.engine_config()
    stage = config["zero_optimization"]["stage"]
    optimizer = build_optimizer(model, settings, clip_in_optimizer=stage == 0)
    scheduler = wsd_scheduler(optimizer, total_steps, settings.warmup_fraction, settings.stable_fraction,
                              settings.min_lr_ratio)
    import deepspeed

    engine, engine_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, mpu=model_parallel_unit()
    )
    if stage >= 1:
        attach_zero_layouts(engine_optimizer, optimizer)
    return EngineParts(engine, optimizer, scheduler)
