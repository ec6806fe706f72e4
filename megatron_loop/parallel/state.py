"""megatron-core's process groups from the launcher's world: tensor-parallel groups inside a node,
data parallelism across.

megatron-core orders ranks TP-fastest: with world size W and TP size N, ranks
``[k N, (k + 1) N)`` form TP group k and ranks ``{j, j + N, j + 2N, ...}`` form DP group j.
Launchers (torchrun, the deepspeed launcher, SLURM) number the ranks of one node
consecutively, so with N dividing the GPUs per node every TP group is inside a node (its
all-reduces stay on NVLink) and only the data-parallel gradient reduction crosses nodes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch.distributed as dist

from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel.cpu import make_megatron_collectives_cpu_capable

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state


@dataclass(frozen=True)
class TensorParallelLayout:
    """Where this rank sits: its TP group (size, rank) and its DP group (size, rank)."""

    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    sequence_parallel: bool = False


def initialize_parallel(tensor_model_parallel_size: int = 1, sequence_parallel: bool = False) -> TensorParallelLayout:
    """Create megatron-core's model-parallel groups over the default process group (which the launcher
    set up: ``training.distributed.setup_distributed``) and return this rank's layout.

    Idempotent for the same TP size; a different TP size than the groups already built is refused
    (megatron-core's groups are process-global)."""
    if not dist.is_initialized():
        raise LoopConfigError("tensor parallelism needs torch.distributed initialised first "
                              "(training.distributed.setup_distributed)")
    world = dist.get_world_size()
    n = tensor_model_parallel_size
    if world % n:
        raise LoopConfigError(f"parallel.tensor_model_parallel_size={n}: expected a divisor of the world size {world}")
    if n > 1:
        make_megatron_collectives_cpu_capable()
    if parallel_state.model_parallel_is_initialized():
        built = parallel_state.get_tensor_model_parallel_world_size()
        if built != n:
            raise LoopConfigError(f"parallel.tensor_model_parallel_size={n}: this process already built "
                                  f"tensor-parallel groups of size {built}")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=n, pipeline_model_parallel_size=1)
    return current_layout(sequence_parallel)


def current_layout(sequence_parallel: bool = False) -> TensorParallelLayout:
    """This rank's layout from megatron-core's groups (TP = 1, DP = 1 when none are built)."""
    if not parallel_state.model_parallel_is_initialized():
        return TensorParallelLayout(sequence_parallel=sequence_parallel)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    return TensorParallelLayout(
        tp_size=tp, tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        dp_size=parallel_state.get_data_parallel_world_size(), dp_rank=parallel_state.get_data_parallel_rank(),
        sequence_parallel=sequence_parallel and tp > 1)


def tensor_parallel_group():
    return parallel_state.get_tensor_model_parallel_group()


def data_parallel_group():
    return parallel_state.get_data_parallel_group()
