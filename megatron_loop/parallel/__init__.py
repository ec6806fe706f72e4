"""Megatron-style tensor parallelism (+ sequence parallelism) for LoopLMs (docs/PARALLELISM.md).

* ``state``   -- megatron-core's TP / DP groups from the launcher's world; this rank's layout.
* ``vocab``   -- vocab-parallel embedding and LM head, the chunked cross-entropy on vocab shards,
  the model's entry and exit of the TP region (:class:`~megatron_loop.parallel.vocab.TensorParallelEdges`).
* ``norm``    -- the block spec's RMSNorm (sequence parallel capable).
* ``grads``   -- summing the partial gradients of replicated parameters over the TP group.
* ``shards``  -- a TP = 1 state dict to this rank's shards and back.
* ``mpu``     -- DeepSpeed's model-parallel unit: ZeRO over the data-parallel group only.
* ``zero``    -- the TP sum of partial gradients inside backward, before ZeRO takes them.
* ``muon``    -- Muon on TP-sharded matrices (gathered over TP, orthogonalised per projection).
* (TP checkpoints: :mod:`megatron_loop.checkpoint.tensor_parallel`.)


The ``parallel:`` config section (``tensor_model_parallel_size``, ``sequence_parallel``) is
:mod:`megatron_loop.config.parallel`. The modules here import megatron-core, so the names below load
:mod:`~megatron_loop.parallel.state` only when used.
"""

__all__ = ["TensorParallelLayout", "current_layout", "initialize_parallel"]


def __getattr__(name):
    if name in __all__:
        from megatron_loop.parallel import state  # megatron-core: the light modules (plan, for --dry-run) skip it

        return getattr(state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
