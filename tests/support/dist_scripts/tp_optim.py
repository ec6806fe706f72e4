"""One rank of the tensor-parallel optimizer test (tests/integration/parallel/test_tp_optim.py), gloo on CPU.

A looped toy on real megatron-core TP layers: a replicated embedding, one megatron-core
``LoopBlock`` (fused QKV + SwiGLU fc1 ``ColumnParallelLinear``, ``RowParallelLinear`` outputs,
replicated RMSNorms) applied ``LOOPS`` times with a replicated injection vector, a replicated norm
and head. Weights come from one seeded whole (TP = 1) state, sliced for this rank, so every TP x DP
layout starts from the same model. Trains ``STEPS`` updates through ``build_engine`` (Muon+AdamW,
accumulation ``ACCUM``, a loss multiplied by ``MULTIPLIER`` at one step so clipping bites), each DP
replica on its own data (a TP = 1 single process accumulates all of it), and records after every
update the whole weights (TP slices merged), the engine's global grad norm and the loss.
It also records the Muon update of every block matrix of a seeded whole matrix through
``tensor_parallel_update`` (merged), to compare with TP = 1's ``orthogonalized_update``.

``--tp T --stage S --out PREFIX``; world from the launcher (none: one process). Writes
``PREFIX.rank{r}.pt``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")

from dist_scripts.optim_zero import skip_shm_comm_build  # noqa: E402

from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer.spec_utils import build_module  # noqa: E402

from megatron_loop.model import roles  # noqa: E402
from megatron_loop.model.compat import rope_freqs, rope_inv_freq, transformer_config  # noqa: E402
from megatron_loop.model.layers import loop_block_spec  # noqa: E402
from megatron_loop.optim import OptimizerSettings, build_engine  # noqa: E402
from megatron_loop.parallel.bootstrap import init_world  # noqa: E402
from megatron_loop.parallel.mpu import data_parallel_size  # noqa: E402
from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config  # noqa: E402
from megatron_loop.optim import muon  # noqa: E402
from megatron_loop.optim.muon import orthogonalized_update  # noqa: E402
from megatron_loop.parallel.bootstrap import init_model_parallel  # noqa: E402
from megatron_loop.optim.muon_tp import tensor_parallel_update  # noqa: E402
from megatron_loop.parallel.grads import is_tensor_parallel  # noqa: E402
from megatron_loop.parallel.shards import shard_of, whole_of  # noqa: E402

VOCAB, HIDDEN, FFN, HEADS, GROUPS, HEAD_DIM, SEQ, LOOPS = 32, 16, 24, 4, 2, 4, 8, 2
LR, STEPS, ACCUM, MICRO, DATA_REPLICAS, MULTIPLIER = 0.02, 4, 2, 2, 2, {2: 1e3}


class LoopedToy(torch.nn.Module):
    """h <- Block(h + c * e) for LOOPS loops (e: the embedded input), then norm and head."""

    def __init__(self, tp: int) -> None:
        super().__init__()
        config = transformer_config(num_layers=1, hidden_size=HIDDEN, intermediate_size=FFN,
                                    num_attention_heads=HEADS, num_key_value_heads=GROUPS, head_dim=HEAD_DIM,
                                    rms_norm_eps=1e-6, qk_norm=False, initializer_range=0.02,
                                    tensor_model_parallel_size=tp)
        self.embed = torch.nn.Parameter(torch.empty(VOCAB, HIDDEN))
        self.injection = torch.nn.Parameter(torch.empty(HIDDEN))
        self.block = build_module(loop_block_spec(False), config=config)
        self.norm = torch.nn.Parameter(torch.empty(HIDDEN))
        self.head = torch.nn.Parameter(torch.empty(VOCAB, HIDDEN))
        for param, role in ((self.embed, roles.EMBEDDING), (self.injection, roles.CONDITIONING),
                            (self.norm, roles.NORM), (self.head, roles.HEAD)):
            roles.set_role(param, role)
        self.register_buffer("rope", rope_freqs(rope_inv_freq(HEAD_DIM, 10000.0, None), SEQ, torch.device("cpu")),
                             persistent=False)

    def forward(self, tokens: torch.Tensor, multiplier: float = 1.0) -> torch.Tensor:
        e = self.embed[tokens].transpose(0, 1)  # [s, b, d]
        h = e
        for _ in range(LOOPS):
            h = self.block(h + self.injection * e, self.rope)
        logits = F.rms_norm(h, (HIDDEN,), self.norm, 1e-6) @ self.head.T
        return multiplier * F.cross_entropy(logits[:-1].reshape(-1, VOCAB), tokens.T[1:].reshape(-1))


def whole_shape(param: torch.nn.Parameter, tp: int) -> torch.Size:
    shape = list(param.shape)
    if is_tensor_parallel(param):
        shape[param.partition_dim] *= tp
    return torch.Size(shape)


def whole_tensor(name: str, shape: torch.Size) -> torch.Tensor:
    """The seeded TP = 1 value of weight ``name`` (norms near 1, the rest small)."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    noise = torch.randn(shape, generator=gen)
    return 1.0 + 0.1 * noise if "norm" in name else 0.3 * noise


def load_whole(model: LoopedToy, tp: int, rank: int) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shard_of(whole_tensor(name, whole_shape(param, tp)), param, rank, tp))


def merged(name_values, tp: int) -> dict[str, torch.Tensor]:
    """Whole tensors from this rank's TP slices (collective over the TP group)."""
    out = {}
    for name, param, value in name_values:
        if not is_tensor_parallel(param) or tp == 1:
            out[name] = value.detach().clone()
            continue
        shards = [torch.empty_like(value) for _ in range(tp)]
        dist.all_gather(shards, value.detach().contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        out[name] = whole_of(shards, param)
    return out


def whole_weights(model: LoopedToy, tp: int) -> dict[str, torch.Tensor]:
    import deepspeed

    params = list(model.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return merged([(n, p, p) for n, p in model.named_parameters()], tp)


def muon_updates(model: LoopedToy, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Muon update of a seeded whole matrix per block matrix: at TP = 1 ``orthogonalized_update``,
    at TP > 1 ``tensor_parallel_update`` of this rank's slice (merged back)."""
    items = []
    for name, param in model.block.named_parameters():
        if roles.role_of(param) != roles.MATRIX:
            continue
        full = whole_tensor("update-" + name, whole_shape(param, tp))
        if tp == 1:
            items.append((name, param, orthogonalized_update(full, param)))
        else:
            items.append((name, param, tensor_parallel_update(shard_of(full, param, rank, tp), param)))
    return merged(items, tp)


def batch(step: int, replica: int, micro: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + 100 * replica + micro)
    return torch.randint(0, VOCAB, (MICRO, SEQ), generator=gen)


def main() -> None:
    skip_shm_comm_build()
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    init_world()
    init_model_parallel(args.tp)
    tp, tp_rank = args.tp, parallel_state.get_tensor_model_parallel_rank()
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    # the DATA_REPLICAS x ACCUM micro-batches of a step: DP rank r takes replica r's (one process: all)
    replicas = [dp_rank] if dp == DATA_REPLICAS else list(range(DATA_REPLICAS))
    accum = ACCUM * len(replicas)
    model = LoopedToy(tp)
    load_whole(model, tp, tp_rank)
    record = {"muon_updates": muon_updates(model, tp, tp_rank)}  # Newton-Schulz in bf16, as shipped
    # The trajectories compare reduction orders (TP, DP) at fp32 tolerance: Newton-Schulz in fp32,
    # where a last-bit input difference cannot flip a bf16 rounding (which moves a weight ~1e-4).
    muon.NS_DTYPE = torch.float32
    config = read_ds_config(zero_stage=args.stage)
    if args.stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    settings = OptimizerSettings(lr=LR)
    ds = DeepSpeedSettings.resolve(config, micro_batch_size=MICRO, grad_accum=accum,
                                   data_parallel_size=data_parallel_size(), bf16=False, grad_clip=settings.grad_clip)
    parts = build_engine(model, settings, ds, total_steps=STEPS)
    record.update(weights=[whole_weights(parts.engine.module, tp)], grad_norms=[], losses=[])
    for step in range(STEPS):
        losses = []
        for replica in replicas:
            for micro in range(ACCUM):
                loss = parts.engine(batch(step, replica, micro), MULTIPLIER.get(step, 1.0))
                parts.engine.backward(loss)
                parts.engine.step()
                losses.append(float(loss))
        record["losses"].append(losses)
        record["grad_norms"].append(float(parts.engine.get_global_grad_norm()))
        record["weights"].append(whole_weights(parts.engine.module, tp))
    zero = parts.engine.optimizer
    record["zero_group"] = dist.get_process_group_ranks(zero.dp_process_group) if args.stage else None
    torch.save(record, f"{args.out}.rank{dist.get_rank()}.pt")


if __name__ == "__main__":
    main()
