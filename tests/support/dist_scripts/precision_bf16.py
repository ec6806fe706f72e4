"""One rank of the bf16 precision test (launched twice by tests/integration/training/test_precision_bf16.py, gloo).

Trains ``FusedToy`` in bf16 through ``build_engine`` with the shipped ZeRO config of the given
stage (Muon + AdamW, micro batch 2, accumulation 4, different data per rank, no clipping) and
records for every optimizer step:

* ``reference_grads``: the data-parallel mean of the micro-batch gradients, each computed by a
  bf16 replica of the engine's model at the same bf16 weights (the very gradients the engine's
  backward produces) and summed in fp64 -- what an fp32 accumulation must reproduce;
* ``seen_grads`` / ``seen_dtypes``: the gradients ``MuonAdamW.step`` receives on its ZeRO
  partitions, gathered back to whole weights through their ``ZeroPartition``;
* ``master``: the fp32 master weights after the step (``safe_get_full_fp32_param``);
* ``bf16_grads_kept``: how many model weights still hold a bf16 ``.grad`` after each backward.

Then a checkpoint round trip as tests/support/dist_scripts/optim_zero.py. Writes ``{out}.rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optim_toy as toy  # noqa: E402
from optim_zero import full_weights, partition_states, stage_arguments  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param  # noqa: E402

from megatron_loop.optim import OptimizerSettings, build_engine  # noqa: E402
from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config  # noqa: E402
from megatron_loop.parallel.bootstrap import init_world  # noqa: E402
from megatron_loop.parallel.mpu import data_parallel_size  # noqa: E402
from megatron_loop.optim.engine import accumulation_dtype, describe_precision  # noqa: E402

LR, ACCUM, MICRO, STEPS = toy.RUN_LR, 4, 2, 5
NO_CLIP = 1e9  # this test is about the sum; clipping is test_optim_zero's


def build(stage: int, seed: int):
    init_world()  # the launcher's world (idempotent)
    config = read_ds_config(zero_stage=stage)
    if stage == 3:  # partition every tiny weight so the striped layout is really exercised
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    ds = DeepSpeedSettings.resolve(config, micro_batch_size=MICRO, grad_accum=ACCUM,
                                   data_parallel_size=data_parallel_size(), bf16=True, grad_clip=NO_CLIP)
    return build_engine(toy.FusedToy(toy.initial_weights(seed)), OptimizerSettings(lr=LR, grad_clip=NO_CLIP), ds,
                        total_steps=STEPS + 1)


def reference_grads(weights: dict[str, torch.Tensor], step: int, rank: int) -> dict[str, torch.Tensor]:
    """The engine's micro-batch gradients (bf16, loss / ACCUM as engine.backward) summed in fp64 over
    micro-batches and ranks, divided by the world size."""
    replica = toy.FusedToy(weights)
    total = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in replica.named_parameters()}
    for micro in range(ACCUM):
        replica.zero_grad(set_to_none=True)
        (replica(toy.batch(step, rank, micro, MICRO)) / ACCUM).backward()
        for name, p in replica.named_parameters():
            assert p.grad.dtype == torch.bfloat16
            total[name] += p.grad.double()
    for value in total.values():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return total


def capture_seen_grads(parts, names: dict[int, str]) -> dict:
    """Make ``MuonAdamW.step`` record the gradients of its partitions as whole weights, and their dtypes."""
    seen: dict = {"grads": {}, "dtypes": set()}
    optimizer = parts.optimizer
    original = optimizer.step

    def record(full: torch.Tensor, weight: torch.nn.Parameter) -> torch.Tensor:
        seen["grads"][names[id(weight)]] = full.clone()
        return full

    def step(*args, **kwargs):
        for group in optimizer.param_groups:
            for partition in group["params"]:
                seen["dtypes"].add(str(partition.grad.dtype))
                optimizer.layout_of(partition).map_full(partition.grad, record)
        return original(*args, **kwargs)

    optimizer.step = step
    return seen


def main() -> None:
    args = stage_arguments()
    parts = build(args.stage, seed=42)
    rank = dist.get_rank()
    module = parts.engine.module
    names = {id(p): name for name, p in module.named_parameters()}
    seen = capture_seen_grads(parts, names)
    record: dict = {"precision": describe_precision(parts.engine), "steps": [],
                    "model_dtype": str(next(module.parameters()).dtype),
                    "initial_master": {n: safe_get_full_fp32_param(p).clone() for n, p in module.named_parameters()}}
    for step in range(STEPS):
        weights = full_weights(parts)
        lrs = [group["lr"] for group in parts.optimizer.param_groups]  # this step's, before the scheduler moves
        reference = reference_grads(weights, step, rank)
        seen["grads"].clear()
        seen["dtypes"].clear()
        bf16_grads_kept = []
        for micro in range(ACCUM):
            parts.engine.backward(parts.engine(toy.batch(step, rank, micro, MICRO)))
            bf16_grads_kept.append(sum(p.grad is not None for p in module.parameters()))
            parts.engine.step()
        record["steps"].append({
            "bf16_grads_kept": bf16_grads_kept,  # model weights still holding a .grad after each backward
            "weights": weights, "reference_grads": reference, "seen_grads": dict(seen["grads"]),
            "seen_dtypes": sorted(seen["dtypes"]), "accumulation_dtype": str(accumulation_dtype(parts.engine.optimizer)),
            "grad_norm": float(parts.engine.get_global_grad_norm()),
            "lrs": lrs,
            "master": {n: safe_get_full_fp32_param(p).clone() for n, p in module.named_parameters()},
        })

    # --- checkpoint round trip: the bf16 wrapper's fp32 partitions and optimizer states ---------------
    states = partition_states(parts)
    parts.engine.save_checkpoint(args.ckpt, tag="t")
    resumed = build(args.stage, seed=7)
    resumed.engine.load_checkpoint(args.ckpt, tag="t")
    loaded = partition_states(resumed)
    record["states_equal"] = len(states) == len(loaded) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(states, loaded))
    record["momentum_restored"] = any("momentum_buffer" in state for state in loaded)
    for engine_parts in (parts, resumed):
        for micro in range(ACCUM):
            engine_parts.engine.backward(engine_parts.engine(toy.batch(STEPS, rank, micro, MICRO)))
            engine_parts.engine.step()
    before, after = full_weights(parts), full_weights(resumed)
    record["continued_equal"] = all(torch.equal(before[name], after[name]) for name in before)
    torch.save(record, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
