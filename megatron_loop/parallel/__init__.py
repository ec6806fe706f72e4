"""Megatron-style tensor parallelism (+ sequence parallelism) for LoopLMs (docs/PARALLELISM.md).

* ``config``  -- the ``parallel:`` section (``tensor_model_parallel_size``, ``sequence_parallel``).
* ``state``   -- megatron-core's TP / DP groups from the launcher's world; this rank's layout.
* ``vocab``   -- vocab-parallel embedding and LM head, the chunked cross-entropy on vocab shards,
  the model's entry and exit of the TP region (:class:`~megatron_loop.parallel.vocab.TensorParallelEdges`).
* ``norm``    -- the block spec's RMSNorm (sequence parallel capable).
* ``grads``   -- summing the partial gradients of replicated parameters over the TP group.
* ``shards``  -- a TP = 1 state dict to this rank's shards and back.
* ``mpu``     -- DeepSpeed's model-parallel unit: ZeRO over the data-parallel group only.
* ``zero``    -- the TP sum of partial gradients inside backward, before ZeRO takes them.
* ``muon``    -- Muon on TP-sharded matrices (gathered over TP, orthogonalised per projection).
* ``checkpoint`` -- TP x DP in the manifest, the resume check, whole weights for the HF export.
"""

from megatron_loop.parallel.config import ParallelConfig
from megatron_loop.parallel.state import TensorParallelLayout, current_layout, initialize_parallel

__all__ = ["ParallelConfig", "TensorParallelLayout", "current_layout", "initialize_parallel"]
