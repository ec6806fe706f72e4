"""DeepSpeed's model-parallel unit (``deepspeed.initialize(mpu=...)``) over megatron-core's groups.

With tensor parallelism (TP) the world is a grid: megatron-core's ``parallel_state`` puts the TP
ranks of a model replica side by side (inside a node) and the data-parallel (DP) replicas across.
DeepSpeed must then shard ZeRO state, average gradients and broadcast initial weights over the
DP group only, and count a replicated parameter's gradient once (not once per TP rank) in the
global norm it clips with. It learns all of this from the ``mpu`` object; DeepSpeed 0.19 calls
(``deepspeed/utils/groups.py``, ``runtime/engine.py``, ``runtime/zero/stage_1_and_2.py``,
``stage3.py``, ``bf16_optimizer.py``, ``runtime/utils.py``):

* ``get_data_parallel_group/_rank/_world_size/_group_ranks``: ZeRO partitions, gradient
  averaging, the batch-size check, checkpoint file names (``zero_pp_rank_{dp}_mp_rank_{tp}``);
* ``get_model_parallel_group/_rank/_world_size``: the global gradient norm is summed over the
  model-parallel group after the DP reduction; a parameter counts on every TP rank when
  ``deepspeed.runtime.utils.is_model_parallel_parameter`` is true (the ``tensor_model_parallel``
  attribute megatron-core's ``ColumnParallelLinear``/``RowParallelLinear``/
  ``VocabParallelEmbedding`` set on their sharded weights), otherwise on model-parallel rank 0
  only; checkpoint file names ``mp_rank_{tp:02d}_model_states.pt``;
* ``get_tensor_model_parallel_rank/_world_size/_group/_src_rank`` and
  ``get_pipeline_model_parallel_world_size`` (the parallel dims recorded in a checkpoint).

Deliberately absent: ``get_sequence_parallel_*`` and ``initialize_sequence_parallel``. DeepSpeed
reads those as its Ulysses sequence parallelism (and the latter makes ZeRO ignore the unit);
megatron-core's sequence parallelism is a TP-internal layout that DeepSpeed need not know.
"""

from __future__ import annotations

import torch.distributed as dist

from megatron.core import parallel_state


class ModelParallelUnit:
    """The ``mpu`` DeepSpeed reads; every answer comes from megatron-core's ``parallel_state``
    (pipeline parallel size 1: the model-parallel group is the TP group)."""

    # data parallel: ZeRO's partition group
    get_data_parallel_group = staticmethod(parallel_state.get_data_parallel_group)
    get_data_parallel_rank = staticmethod(parallel_state.get_data_parallel_rank)
    get_data_parallel_world_size = staticmethod(parallel_state.get_data_parallel_world_size)
    # model parallel = tensor parallel x pipeline parallel (1)
    get_model_parallel_group = staticmethod(parallel_state.get_model_parallel_group)
    get_tensor_model_parallel_group = staticmethod(parallel_state.get_tensor_model_parallel_group)
    get_tensor_model_parallel_rank = staticmethod(parallel_state.get_tensor_model_parallel_rank)
    get_tensor_model_parallel_world_size = staticmethod(parallel_state.get_tensor_model_parallel_world_size)
    get_tensor_model_parallel_src_rank = staticmethod(parallel_state.get_tensor_model_parallel_src_rank)
    get_pipeline_model_parallel_group = staticmethod(parallel_state.get_pipeline_model_parallel_group)
    get_pipeline_model_parallel_rank = staticmethod(parallel_state.get_pipeline_model_parallel_rank)
    get_pipeline_model_parallel_world_size = staticmethod(parallel_state.get_pipeline_model_parallel_world_size)

    @staticmethod
    def get_data_parallel_group_ranks() -> list[int]:
        return dist.get_process_group_ranks(parallel_state.get_data_parallel_group())

    @staticmethod
    def get_model_parallel_rank() -> int:
        return dist.get_rank(group=parallel_state.get_model_parallel_group())

    @staticmethod
    def get_model_parallel_world_size() -> int:
        return dist.get_world_size(group=parallel_state.get_model_parallel_group())


def tensor_parallel_size() -> int:
    """TP size of this process (1 when megatron-core's groups are not initialised)."""
    if not dist.is_initialized() or not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


def model_parallel_unit() -> ModelParallelUnit | None:
    """The unit for ``deepspeed.initialize`` when TP > 1; None at TP = 1 (DeepSpeed's own
    world-wide data-parallel group, the checkpoint names of a run without TP)."""
    return ModelParallelUnit() if tensor_parallel_size() > 1 else None


def data_parallel_size() -> int:
    """Number of model replicas: the world at TP = 1, world / TP otherwise."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size() // tensor_parallel_size()
