#!/usr/bin/env python
"""Tensor-parallel step time against TP = 1 on the same GPUs (docs/PARALLELISM.md).

    torchrun --nproc_per_node 2 tools/bench_tp.py --config examples/qwen_4x7.yaml --tp 1,2 \
        --micro-batch 4 --json bench_tp.json

For each TP size in ``--tp`` (one after another, in this one launch) every rank builds the model
of ``--config`` at that size (megatron-core's groups rebuilt), and times forward + backward + the
TP sum of partial gradients (``parallel.grads``) of one micro-batch, ``--steps`` times after
``--warmup`` (median, device synchronised at step boundaries only). Data parallelism is left out
(no gradient all-reduce over DP): the figure is the TP cost alone. Reported per GPU: tokens/s
(the DP group's tokens over its t GPUs), model TFLOP/s over the effective depth (``flops.py``),
and the TP traffic the byte model of ``parallel/plan.py`` predicts per micro-batch, with the
bus bandwidth it would take if the whole step were communication. CUDA: bf16, nccl; CPU: fp32,
gloo (runs, but says nothing about GPUs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_loop.config import ParallelConfig, load_config  # noqa: E402
from megatron_loop.flops import train_flops_per_token  # noqa: E402
from megatron_loop.measure.timing import synchronize  # noqa: E402
from megatron_loop.model import build_model  # noqa: E402
from megatron_loop.parallel import initialize_parallel  # noqa: E402
from megatron_loop.parallel.grads import allreduce_partial_grads  # noqa: E402
from megatron_loop.parallel.plan import tp_communication_bytes  # noqa: E402


def step_seconds(model, tokens: torch.Tensor, device: torch.device, steps: int, warmup: int) -> float:
    times = []
    for i in range(warmup + steps):
        synchronize(device)
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(tokens, labels=tokens, compute_logits=False).loss.backward()
        allreduce_partial_grads(model)
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tp", default="1,2", help="TP sizes to compare, comma separated (each divides the world)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--micro-batch", type=int, default=None, help="default: the config's train.micro_batch_size")
    p.add_argument("--seq-length", type=int, default=None, help="default: the config's train.seq_length")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(__import__("os").environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    cfg = load_config(args.config, overrides=args.set + ["model.compile=false"])
    m, t = cfg.model, cfg.train
    micro, seq = args.micro_batch or t.micro_batch_size, args.seq_length or t.seq_length
    itemsize = 2 if cuda else 4
    results = []
    for tp in (int(x) for x in args.tp.split(",")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core import parallel_state
        parallel_state.destroy_model_parallel()
        initialize_parallel(tp, args.sequence_parallel and tp > 1)
        parallel = ParallelConfig(tp, args.sequence_parallel and tp > 1)
        torch.manual_seed(t.seed)
        model = build_model(m, parallel=parallel).to(device)
        if cuda:
            model = model.bfloat16()
        tokens = torch.randint(0, m.vocab_size, (micro, seq), generator=torch.Generator().manual_seed(0)).to(device)
        seconds = step_seconds(model, tokens, device, args.steps, args.warmup)
        comm = tp_communication_bytes(m, tp, parallel.sequence_parallel, micro, seq, itemsize)
        tokens_per_gpu = micro * seq / tp / seconds
        results.append(dict(tp=tp, sequence_parallel=parallel.sequence_parallel, step_s=seconds,
                            tokens_per_s_per_gpu=tokens_per_gpu,
                            tflops_per_gpu=tokens_per_gpu * train_flops_per_token(m, seq) / 1e12,
                            tp_comm_bytes=comm, comm_gbps_if_all_comm=comm / seconds / 1e9))
        del model
    if dist.get_rank() == 0:
        base = results[0]["tokens_per_s_per_gpu"]
        for r in results:
            r["throughput_vs_first"] = r["tokens_per_s_per_gpu"] / base
            print(json.dumps(r))
        if args.json:
            Path(args.json).write_text(json.dumps(dict(config=args.config, micro_batch=micro, seq_length=seq,
                                                       device=str(device), world=dist.get_world_size(),
                                                       results=results), indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
