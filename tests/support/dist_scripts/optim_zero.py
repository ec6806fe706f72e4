"""One rank of the ZeRO optimizer test (launched twice by tests/integration/parallel/test_zero.py, gloo).

Trains ``FusedToy`` through ``build_engine`` at the given ZeRO stage (0 = no ZeRO, fp32) with different data per
rank, gradient accumulation 2 and a huge-gradient step, recording after every optimizer step
the full weights, the engine's reported grad norm and the group learning rates. Then it saves
a DeepSpeed checkpoint, loads it into a freshly built engine (different initial weights) and
checks that the partitioned optimizer state (Muon momentum, AdamW moments), weights and
schedule come back bitwise and that one more step on both engines gives identical weights.
Writes ``{out}.rank{r}.pt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import deepspeed  # noqa: E402
import optim_toy as toy  # noqa: E402

from megatron_loop.optim import OptimizerSettings, build_engine  # noqa: E402
from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config  # noqa: E402
from megatron_loop.parallel.bootstrap import init_world  # noqa: E402
from megatron_loop.parallel.mpu import data_parallel_size  # noqa: E402

LR, STEPS, ACCUM, MICRO, MULTIPLIER = toy.RUN_LR, toy.RUN_STEPS, toy.RUN_ACCUM, toy.RUN_MICRO, toy.RUN_MULTIPLIER


def build(stage: int, seed: int):
    init_world()  # the launcher's world (idempotent)
    config = read_ds_config(zero_stage=stage)
    if stage == 3:
        # partition every tiny weight (no persistence) so the striped layout is really exercised
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    settings = OptimizerSettings(lr=LR)
    ds = DeepSpeedSettings.resolve(config, micro_batch_size=MICRO, grad_accum=ACCUM,
                                   data_parallel_size=data_parallel_size(), bf16=False, grad_clip=settings.grad_clip)
    return build_engine(toy.FusedToy(toy.initial_weights(seed)), settings, ds, total_steps=STEPS)


def train_step(parts, step: int, rank: int) -> None:
    for micro in range(ACCUM):
        loss = parts.engine(toy.batch(step, rank, micro, MICRO), MULTIPLIER.get(step, 1.0))
        parts.engine.backward(loss)
        parts.engine.step()
    assert parts.engine.global_steps == step + 1


def full_weights(parts) -> dict[str, torch.Tensor]:
    module = parts.engine.module
    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return {name: p.detach().clone() for name, p in module.named_parameters()}


def partitions(parts) -> list[torch.Tensor]:
    """The tensors the optimizer state is keyed by: ZeRO's fp32 partitions, or (stage 0) the
    model's own weights."""
    zero = parts.engine.optimizer
    if zero is parts.optimizer:
        return list(parts.engine.module.parameters())
    if hasattr(zero, "fp32_partitioned_groups_flat"):
        return list(zero.fp32_partitioned_groups_flat)
    if hasattr(zero, "fp32_groups_flat_partition"):  # BF16_Optimizer (bf16, ZeRO 1)
        return list(zero.fp32_groups_flat_partition)
    return list(zero.single_partition_of_fp32_groups)


def partition_states(parts) -> list[dict[str, torch.Tensor]]:
    return [
        {key: value.clone() for key, value in parts.optimizer.state[flat].items()} for flat in partitions(parts)
    ]


def skip_shm_comm_build() -> None:
    """Use plain gloo collectives: DeepSpeed's CPU shared-memory allreduce op is JIT-compiled on
    first use (~30-90 s, and rebuilt whenever another checkout shares the extension cache); it
    is a CPU speed-up only and irrelevant to what this test checks."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def stage_arguments() -> argparse.Namespace:
    """``--stage --out --ckpt`` of a launch by ``optim_toy.launch_stages``; gloo collectives only."""
    skip_shm_comm_build()
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt", required=True)
    return parser.parse_args()


def main() -> None:
    args = stage_arguments()
    parts = build(args.stage, seed=42)
    rank = torch.distributed.get_rank()
    record: dict = {"weights": [full_weights(parts)], "grad_norms": [], "lrs": []}
    for step in range(STEPS):
        record["lrs"].append([group["lr"] for group in parts.optimizer.param_groups])
        train_step(parts, step, rank)
        record["grad_norms"].append(float(parts.engine.get_global_grad_norm()))
        record["weights"].append(full_weights(parts))
    record["group_names"] = [group["name"] for group in parts.optimizer.param_groups]
    record["partition_numels"] = [flat.numel() for flat in partitions(parts)]

    # --- checkpoint round trip -------------------------------------------------------------
    states = partition_states(parts)
    parts.engine.save_checkpoint(args.ckpt, tag="t")
    resumed = build(args.stage, seed=7)
    resumed.engine.load_checkpoint(args.ckpt, tag="t")
    loaded = partition_states(resumed)
    record["state_keys"] = [sorted(state) for state in states]
    record["momentum_nonzero"] = any(
        "momentum_buffer" in state and bool(state["momentum_buffer"].abs().sum() > 0) for state in states
    )
    record["states_equal"] = len(states) == len(loaded) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        for a, b in zip(states, loaded)
    )
    before, after = full_weights(parts), full_weights(resumed)
    record["weights_equal"] = all(torch.equal(before[name], after[name]) for name in before)
    record["scheduler_equal"] = parts.scheduler.state_dict() == resumed.scheduler.state_dict()
    record["lrs_equal"] = [g["lr"] for g in parts.optimizer.param_groups] == [
        g["lr"] for g in resumed.optimizer.param_groups
    ]
    train_step(parts, STEPS, rank)
    train_step(resumed, STEPS, rank)
    before, after = full_weights(parts), full_weights(resumed)
    record["continued_equal"] = all(torch.equal(before[name], after[name]) for name in before)
    torch.save(record, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
