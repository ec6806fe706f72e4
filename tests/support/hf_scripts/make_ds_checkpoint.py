"""Write tiny DeepSpeed checkpoints of LoopLMs for the HF export tests (CPU, fp32, gloo).

    python make_ds_checkpoint.py --spec specs.json --zero 1               # one process
    torchrun --nproc_per_node 2 make_ds_checkpoint.py --spec s.json --zero 3

``specs.json`` maps a name to ``{"model": {...ModelConfig fields...}, "out": DIR}``. For each
model: build the LoopLM (seed 0), move every conditioning and norm parameter away from its
identity initialisation (so an export bug cannot hide behind zeros), wrap it with
``deepspeed.initialize`` (ZeRO ``--zero``, AdamW client optimizer), take one optimizer step
on random tokens, ``save_checkpoint(out, tag="step_1")`` and write ``looplm_config.json``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import deepspeed
from megatron_loop.config import config_from_dict
from megatron_loop.model import build_model
from megatron_loop.checkpoint.folders import save_run_config
from megatron_loop.parallel.bootstrap import init_world
from megatron_loop.parallel.parallelize import register_external_parameters


def perturb_identity_parameters(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or any(k in name for k in ("injection", "gating", "gate.q", "adaln")):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def write_checkpoint(model_fields: dict, out: str, zero: int, tokenizer: str | None) -> None:
    cfg = config_from_dict({"model": model_fields, "data": {"tokenizer": tokenizer},
                            "train": {"seq_length": 16, "micro_batch_size": 2, "global_batch_size": 2}})
    torch.manual_seed(0)
    model = build_model(cfg.model)
    perturb_identity_parameters(model, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": zero, "stage3_param_persistence_threshold": 0},
                 "fp16": {"enabled": False}, "bf16": {"enabled": False}}
    if zero == 3:  # as parallelize does: the LM head weight is applied outside its module
        register_external_parameters(model)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    rank = dist.get_rank()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(10 + rank))
    loss = engine(tokens, labels=tokens, compute_logits=False).loss
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out, tag="step_1")
    if rank == 0:
        save_run_config(out, cfg)
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--zero", type=int, required=True)
    ap.add_argument("--tokenizer")
    args = ap.parse_args()
    # the project's world (plain python: a world of one; torchrun: its ranks), which does not JIT-build
    # DeepSpeed's CPU shared-memory extension (tests/conftest.py fails the suite when anything builds it)
    init_world()
    for name, spec in json.loads(open(args.spec).read()).items():
        write_checkpoint(spec["model"], spec["out"], args.zero, args.tokenizer)
        if dist.get_rank() == 0:
            print(f"wrote {name} -> {spec['out']}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
