"""One rank of the tensor-parallel equivalence test (launched by tests/integration/parallel/test_tp_equivalence.py under
torchrun, gloo): builds each model of ``tp_fixtures.MODELS`` at TP = ``--tp`` with sequence
parallelism off and on, prepares it as training does (``parallel.parallelize``: the TP sum of
partial gradients inside backward) and runs it through ``build_engine``'s DeepSpeed engine at ZeRO
stage 0 (fp32, where the gradients stay on the parameters): forward and ``engine.backward`` on this
data-parallel rank's micro-batch, the engine averaging over the DP group. Every parameter and
gradient is gathered whole, and the partial gradients also as they were before the TP sum (a hook
registered ahead of the sum's). With ``--data`` it also records the first micro-batches of the
training loop's loaders on every rank. Rank 0 writes ``--out`` (torch.save)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tp_fixtures as fx  # noqa: E402

from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config  # noqa: E402
from megatron_loop.model import build_model  # noqa: E402
from megatron_loop.parallel.bootstrap import init_model_parallel  # noqa: E402
from megatron_loop.optim import OptimizerSettings, build_engine  # noqa: E402
from megatron_loop.parallel.grads import partial_grad_parameters, register_tp_gradient_sum  # noqa: E402
from megatron_loop.parallel.parallelize import parallelize  # noqa: E402
from megatron_loop.model.placement import data_parallel_group  # noqa: E402
from megatron_loop.training.distributed import setup_distributed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", help="an indexed prefix: also record the micro-batches each rank reads")
    args = parser.parse_args()
    setup_distributed(60)  # the training loop's path: the launcher's world through DeepSpeed, gloo on CPU
    layout = init_model_parallel(args.tp)
    record = {"layout": [None] * dist.get_world_size(), "cases": {}}
    dist.all_gather_object(record["layout"], (layout.tp_rank, layout.dp_rank))
    for name in fx.MODELS:
        for sp in (False, True):
            torch.manual_seed(fx.SEED)
            model = build_model(fx.model_config(name),
                                dataclasses.replace(layout, sequence_parallel=sp and args.tp > 1))
            init = fx.gather_whole(model, {n: p.detach().clone() for n, p in model.named_parameters()})
            fx.perturb(model)
            partial = dict(partial_grad_parameters(model))
            seen = {}
            for n, p in partial.items():  # registered first: sees each gradient before the TP sum
                p.register_hook(lambda grad, n=n: seen.__setitem__(n, grad.detach().clone()))
            parallelize(model, zero_stage=0)
            model.loss_chunk_tokens = fx.CHUNK
            settings = OptimizerSettings(lr=0.0)
            ds = DeepSpeedSettings.resolve(read_ds_config(zero_stage=0), micro_batch_size=fx.MICRO, grad_accum=1,
                                           data_parallel_size=layout.dp_size, bf16=False, grad_clip=settings.grad_clip)
            engine = build_engine(model, settings, ds, total_steps=1).engine
            tokens, labels = fx.batch(layout.dp_rank)
            result = engine(tokens, labels=labels, **fx.forward_kwargs(model))
            engine.backward(result.loss)  # the TP sum in backward, then the engine's DP mean
            out = {"losses": result.loss.detach()[None], "logits": result.logits.detach()[None]}
            before = {}
            for n, grad in seen.items():  # the DP mean of the pre-sum gradients, as the engine averages
                dist.all_reduce(grad, group=data_parallel_group())
                before[n] = grad / layout.dp_size
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            before_sum = fx.gather_whole(model, {**grads, **before})
            losses = [torch.zeros_like(out["losses"]) for _ in range(layout.dp_size)]
            dist.all_gather(losses, out["losses"], group=data_parallel_group())
            logits = [torch.zeros_like(out["logits"]) for _ in range(layout.dp_size)]
            dist.all_gather(logits, out["logits"], group=data_parallel_group())
            record["cases"][(name, sp)] = {
                "init": init, "losses": torch.cat(losses), "logits": torch.cat(logits),
                "grads": fx.gather_whole(model, grads),
                "grads_before_tp_sum": before_sum,
                "partial": sorted(partial),
                "params_per_rank": sum(p.numel() for p in model.parameters()),
            }
    record["training"] = {}
    # 20 AdamW steps: this rank's loss, DP-averaged, before each step; "no TP sum" leaves the
    # partial gradients of sequence parallelism unreduced (what the test must be able to see)
    for key, sp, tp_sum in ((False, False, True), (True, True, True), ("no TP sum", True, False)):
        torch.manual_seed(fx.SEED)
        model = build_model(fx.model_config("llama"),
                            dataclasses.replace(layout, sequence_parallel=sp and args.tp > 1))
        if tp_sum:
            register_tp_gradient_sum(model)  # training's one path (parallelize calls it)

        def reduce_grads():
            for p in model.parameters():
                dist.all_reduce(p.grad, group=data_parallel_group())
                p.grad /= layout.dp_size

        losses = torch.tensor(fx.train(model, [layout.dp_rank], reduce_grads))
        dist.all_reduce(losses, group=data_parallel_group())
        record["training"][key] = (losses / layout.dp_size).tolist()
    if args.data:  # the training loop's loaders: sharded by data-parallel rank
        from megatron_loop.training.setup import data_loaders

        batches = fx.first_micro_batches(data_loaders(fx.data_config(args.data), total_steps=2).train)
        record["batches"] = [None] * dist.get_world_size()
        dist.all_gather_object(record["batches"], batches)
    if dist.get_rank() == 0:
        torch.save(record, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
