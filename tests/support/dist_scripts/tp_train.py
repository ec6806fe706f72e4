"""One rank of the tensor-parallel training test (tests/integration/parallel/test_tp_train.py), gloo on CPU.

Trains ``tp_fixtures``' "llama" LoopLM (1+2x3+1 with channel initial + history injection and Loop
Gating, conditioning moved off its identity start) for ``--steps`` updates through
``build_engine`` (Muon+AdamW, ZeRO ``--stage``, accumulation 2, fp32) at TP = ``--tp`` with
sequence parallelism ``--sp``, on the launcher's world (TP x DP; no launcher: one process). A step
reads ``REPLICAS`` x 2 micro-batches whichever the layout: each DP rank the ones of its replicas
(a single process: all of them), so every layout sees the same data per update. Newton-Schulz
runs in fp32 (see tests/integration/parallel/test_tp_optim.py). Records per step the mean loss over the global batch
and the engine's grad norm, and at the end the whole weights (TP slices merged); rank 0 writes
``--out``. ``--save-at S``: saves a checkpoint after update S into ``--ckpt`` through the training
loop's ``save_checkpoint`` (manifest with the TP layout, run config; the whole weights then are
recorded as ``weights_at_save``) and, at the end, builds a second engine (initial weights, no
optimizer state), resumes it with ``load_checkpoint`` and trains the remaining updates again,
recording those losses and weights (``resumed``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tp_fixtures as fx  # noqa: E402
from dist_scripts.optim_zero import skip_shm_comm_build  # noqa: E402

from megatron_loop.config import config_from_dict  # noqa: E402
from megatron_loop.model import build_model  # noqa: E402
from megatron_loop.checkpoint.selection import select_explicit  # noqa: E402
from megatron_loop.optim import OptimizerSettings, build_engine  # noqa: E402
from megatron_loop.parallel.bootstrap import init_world  # noqa: E402
from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config  # noqa: E402
from megatron_loop.optim import muon  # noqa: E402
from megatron_loop.parallel.bootstrap import init_model_parallel  # noqa: E402
from megatron_loop.parallel.parallelize import parallelize  # noqa: E402
from megatron_loop.model.placement import data_parallel_group  # noqa: E402
from megatron_loop.training import checkpoint as C  # noqa: E402
from megatron_loop.training.distributed import DistInfo  # noqa: E402
from megatron_loop.training.resume import run_settings  # noqa: E402

LR, ACCUM, REPLICAS, MODEL = 0.01, 2, 2, "llama"


def batch(step: int, replica: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counting sequences (a seeded start, stride 1 or 3, modulo 64): learnable within 20 updates."""
    g = torch.Generator().manual_seed(10_000 + 100 * step + 10 * replica + micro)
    start = torch.randint(0, 64, (fx.MICRO, 1), generator=g)
    stride = 1 + 2 * torch.randint(0, 2, (fx.MICRO, 1), generator=g)
    tokens = (start + stride * torch.arange(fx.SEQ)) % 64
    labels = tokens.clone()
    labels[0, 3] = -100
    return tokens, labels


def build(args, layout):
    torch.manual_seed(fx.SEED)
    model = build_model(fx.model_config(MODEL), layout)
    fx.perturb(model)
    model.loss_chunk_tokens = fx.CHUNK
    parallelize(model, zero_stage=args.stage)  # as training: the TP sum of partial gradients inside backward
    config = read_ds_config(zero_stage=args.stage)
    if args.stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    replicas = REPLICAS // layout.dp_size
    settings = OptimizerSettings(lr=LR)
    ds = DeepSpeedSettings.resolve(config, micro_batch_size=fx.MICRO, grad_accum=ACCUM * replicas,
                                   data_parallel_size=layout.dp_size, bf16=bool(args.bf16),
                                   grad_clip=settings.grad_clip)
    return build_engine(model, settings, ds, total_steps=args.steps)


def train(parts, layout, steps: range) -> tuple[list[float], list[float]]:
    per = REPLICAS // layout.dp_size
    losses, norms = [], []
    for step in steps:
        total = torch.zeros(())
        for replica in range(layout.dp_rank * per, (layout.dp_rank + 1) * per):
            for micro in range(ACCUM):
                tokens, labels = batch(step, replica, micro)
                loss = parts.engine(tokens, labels=labels).loss
                parts.engine.backward(loss)
                parts.engine.step()
                total += loss.detach()
        dist.all_reduce(total, group=data_parallel_group())
        losses.append(float(total) / (REPLICAS * ACCUM))
        norms.append(float(parts.engine.get_global_grad_norm()))
    return losses, norms


def run_config():
    """The run config a checkpoint records (the model of this test; no tokenizer: the export has none)."""
    return config_from_dict({"model": fx.MODELS[MODEL], "train": {"seq_length": fx.SEQ, "micro_batch_size": fx.MICRO,
                                                                  "global_batch_size": fx.MICRO * ACCUM * REPLICAS}})


def whole_weights(model) -> dict[str, torch.Tensor]:
    import deepspeed

    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), enabled=hasattr(next(iter(params.values())), "ds_id")):
        return fx.gather_whole(model, {n: p.detach().clone() for n, p in params.items()})


def main() -> None:
    skip_shm_comm_build()
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--sp", type=int, default=0)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--ckpt", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--bf16", type=int, default=0)  # the GPU precision: bf16 weights, fp32 accumulation
    args = parser.parse_args()
    if not args.bf16:  # fp32 runs compare to 1e-6: no bf16 rounding in Newton-Schulz (bf16 runs keep it, as shipped)
        muon.NS_DTYPE = torch.float32
    init_world()
    layout = init_model_parallel(args.tp, bool(args.sp))
    parts = build(args, layout)
    first = args.save_at or args.steps
    losses, norms = train(parts, layout, range(first))
    record = {}
    if args.save_at:  # through the training loop's atomic save (manifest, run config, RNG per rank)
        info = DistInfo(dist.get_rank(), dist.get_world_size(), dist.get_rank())
        cfg = run_config()
        record["weights_at_save"] = whole_weights(parts.engine.module)
        C.save_checkpoint(parts.engine, Path(args.ckpt), C.TrainState(step=first), cfg, info,
                          run_settings(cfg, info.world_size, args.stage))
        more, more_norms = train(parts, layout, range(first, args.steps))
        losses, norms = losses + more, norms + more_norms
    record.update(losses=losses, grad_norms=norms, weights=whole_weights(parts.engine.module))
    if args.save_at:
        resumed = build(args, layout)
        state = C.load_checkpoint(resumed.engine, select_explicit(Path(args.ckpt)), info)
        again, _ = train(resumed, layout, range(state.step, args.steps))
        record["resumed"] = {"losses": again, "weights": whole_weights(resumed.engine.module)}
    if dist.get_rank() == 0:
        torch.save(record, args.out)
    dist.barrier()


if __name__ == "__main__":
    main()
