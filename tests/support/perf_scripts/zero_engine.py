"""The training step inside DeepSpeed's engine on CPU, for what the GPU path needs (one process).

Prints one JSON line with, per part:

* ``train_step``: host syncs the detector (``measure.host_sync.find_host_syncs``) sees in ``training.loop.train_step``
  on the tiny run config (real loaders and ZeRO-1 engine; the second step, after the first built
  the caches), grouped by kind and by site;
* ``pending``: what ``auto`` recomputation counts as not yet allocated at the first forward
  (``optim/memory.py``), before and after the first optimizer step, under ZeRO-1 and ZeRO-3, next
  to the model's own parameter counts;
* ``graphs``: graphs dynamo makes of the compiled blocks (a counting backend) in one forward and
  backward through the engine, under ZeRO-1 and ZeRO-3.

Usage: python zero_engine.py OUT_DIR   (tests/integration/training/test_zero_engine.py runs it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def train_step_syncs(out_dir: Path) -> dict:
    from train_fixtures import tiny_config

    from megatron_loop.config import load_config
    from megatron_loop.measure.host_sync import find_host_syncs
    from megatron_loop.training.loop import train_step
    from megatron_loop.training.setup import build_run

    cfg = load_config(str(tiny_config(out_dir, train={"max_steps": 3})))
    run, _, logger = build_run(cfg, None)
    try:
        train_step(run)
        syncs = find_host_syncs(lambda: train_step(run))
    finally:
        logger.close()
        run.lock.release()
    return {"syncs": syncs, "compile_note": run.engine.module.compile_note}


def engines(stage: int) -> dict:
    from torch._dynamo.testing import CompileCounter

    from megatron_loop.config import build_model_config
    from megatron_loop.model import build_model, roles
    from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config
    from megatron_loop.parallel.mpu import data_parallel_size
    from megatron_loop.optim import OptimizerSettings, build_engine
    from megatron_loop.parallel.parallelize import apply_compile, parallelize
    from megatron_loop.optim.memory import pending_training_memory

    torch._dynamo.reset()
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=2, compile=False,
                                  recompute="none"))
    torch.manual_seed(0)
    model = build_model(cfg)
    muon = sum(p.numel() for p in model.parameters() if roles.uses_muon(p))
    adamw = sum(p.numel() for p in model.parameters()) - muon
    counter = CompileCounter()
    parallelize(model, zero_stage=stage)  # as training prepares it (compile off in the config: compiled below)
    apply_compile(model, backend=counter)
    settings = OptimizerSettings(lr=1e-3)
    ds = DeepSpeedSettings.resolve(read_ds_config(zero_stage=stage), micro_batch_size=2, grad_accum=1,
                                   data_parallel_size=data_parallel_size(), bf16=False, grad_clip=settings.grad_clip)
    parts = build_engine(model, settings, ds, total_steps=10)
    engine = parts.engine
    before = pending_training_memory(engine, parts.optimizer)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    engine.backward(engine(x, labels=x, compute_logits=False).loss)
    graphs = counter.frame_count
    engine.step()
    after = pending_training_memory(engine, parts.optimizer)
    state = [t for s in parts.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
    masters = getattr(engine.optimizer, "single_partition_of_fp32_groups", [])  # ZeRO 1/2's fp32 partitions
    return {"graphs": graphs, "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            "muon_numel": muon, "adamw_numel": adamw, "reduce_bucket_size": engine.zero_reduce_bucket_size(),
            "prefetch_bucket_size": engine.zero_prefetch_bucket_size(),
            "before": vars(before), "after": vars(after),
            # what the plan's memory check counts (training/memory_plan.py), measured on the engine after a step
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
            "master_bytes": sum(t.numel() * t.element_size() for t in masters)}


if __name__ == "__main__":
    from megatron_loop.parallel.bootstrap import init_world

    import time

    init_world()
    start = time.process_time()
    result = {"train_step": train_step_syncs(Path(sys.argv[1]))}
    result["cpu_s"] = {"train_step": time.process_time() - start}
    for stage in (1, 3):
        start = time.process_time()
        result[f"zero{stage}"] = engines(stage)
        result["cpu_s"][f"zero{stage}"] = time.process_time() - start
    print("RESULT " + json.dumps(result), flush=True)
