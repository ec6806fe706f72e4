r"""``--mode tp``: tensor-parallel step time against TP = 1 on the same GPUs (docs/PARALLELISM.md),
under a launcher:

    torchrun --nproc_per_node 2 tools/bench.py --mode tp --config examples/qwen_4x7.yaml --tp 1,2 \
        --micro-batch 4 --json bench_tp.json

For each TP size of ``--tp`` (one after another, in this one launch) every rank builds the model
of ``--config`` at that size (megatron-core's groups rebuilt) and times forward + backward + the
TP sum of partial gradients of one micro-batch (``parallel.grads.register_tp_gradient_sum``: the
one path training takes, inside backward; ``tp_grad_allreduces`` is how many all-reduces it issues
per micro-batch). Data parallelism is left out
(no gradient all-reduce over DP): the figure is the TP cost alone. Per GPU: tokens/s (the model
copy's tokens over its t GPUs), model TFLOP/s over the effective depth (``megatron_loop.flops``),
and the TP traffic the byte model of ``parallel/per_rank.py`` predicts per micro-batch, with the bus
bandwidth it would take if the whole step were communication. Activation recomputation is off
(the byte model counts no recomputation). CUDA: bf16, nccl; CPU: fp32, gloo, the widths shrunk as
the other modes shrink them (it runs, but says nothing about GPUs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch.distributed as dist
from megatron.core import parallel_state

from megatron_loop.config import ParallelConfig, load_config
from megatron_loop.config.launch_env import launch_world_size
from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel.bootstrap import init_model_parallel, init_world
from megatron_loop.parallel.grads import partial_grad_parameters
from megatron_loop.parallel.per_rank import tp_communication_bytes

from .harness import Case, ModelFlops, Row, Setup, fail, measure, release
from .models import build, cpu_overrides, forward_backward
from .synthetic import random_tokens


def parallel_configs(tp_sizes: list[int], sequence_parallel: bool, model, seq: int) -> list[ParallelConfig]:
    """One ``ParallelConfig`` per TP size (sequence parallelism only where TP > 1), each checked
    against the launcher's world and the model before any is built."""
    world = launch_world_size()  # checked: WORLD_SIZE=abc is one error line
    configs = []
    for tp in tp_sizes:
        parallel = ParallelConfig(tp, sequence_parallel and tp > 1)
        try:
            parallel.validate()
            parallel.check_world(world, seq)
            parallel.check_model(model)
        except LoopConfigError as e:
            fail(f"--tp {tp}: {e}")
        configs.append(parallel)
    return configs


def bench_tensor_parallel(setup: Setup, config: str, tp_sizes: list[int], sequence_parallel: bool,
                          micro_batch: int | None, overrides: list[str]) -> list[Row]:
    sets = [f"model.compile={str(setup.compile).lower()}", "model.recompute=none"]
    cfg = load_config(config, overrides=sets + cpu_overrides(setup) + list(overrides))
    micro = micro_batch or cfg.train.micro_batch_size
    configs = parallel_configs(tp_sizes, sequence_parallel, cfg.model, setup.seq)
    init_world()  # the launcher's world (each rank on its own GPU; a plain launch: a world of one)
    itemsize = setup.dtype.itemsize
    rows = []
    for parallel in configs:
        tp, sp = parallel.tensor_model_parallel_size, parallel.sequence_parallel
        parallel_state.destroy_model_parallel()  # megatron-core's groups are process-global: one TP size at a time
        placement = init_model_parallel(tp, sp)
        model = build(cfg.model, setup, placement)  # prepared as for training: the TP gradient sum in backward
        tokens = random_tokens(cfg.model, setup, micro)

        def step(model=model, tokens=tokens) -> None:
            forward_backward(model, tokens)
            model.zero_grad(set_to_none=True)

        name = f"{Path(config).stem} tp {tp}" + (" sp" if sp else "")
        metrics = measure({name: Case(step, micro * setup.seq / tp, ModelFlops(cfg.model, setup.seq))}, setup)[name]
        comm = tp_communication_bytes(cfg.model, tp, sp, micro, setup.seq, itemsize)
        metrics.update(tp_comm_bytes=comm, comm_gbps_if_all_comm=comm / metrics["step_s"] / 1e9,
                       tp_grad_allreduces=len(partial_grad_parameters(model)))
        params = {"config": config, "tp": tp, "sequence_parallel": sp, "world": dist.get_world_size(),
                  "micro_batch": micro, "seq": setup.seq, "per_gpu": "tokens_per_s, tflops"}
        rows.append(Row("tp", name, params, metrics))
        del model, step
        release(setup)
    parallel_state.destroy_model_parallel()
    for row in rows:  # per GPU, against the first TP size of --tp
        row.metrics["throughput_vs_first"] = row.metrics["tokens_per_s"] / rows[0].metrics["tokens_per_s"]
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_tensor_parallel(setup, args.config, args.tp, args.sequence_parallel, args.micro_batch, args.set)
