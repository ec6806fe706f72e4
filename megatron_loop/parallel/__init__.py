"""Megatron-style tensor parallelism (+ sequence parallelism) for LoopLMs (docs/PARALLELISM.md).

* ``bootstrap`` -- the one place process groups are created: the launcher's world, megatron-core's
  TP / DP groups (both bounded by ``train.collective_timeout_s``), a world of one outside a launcher.
* ``groups``    -- this rank's place in those groups (read only).
* ``vocab``     -- vocab-parallel embedding and LM head, the chunked cross-entropy on vocab shards,
  the model's entry and exit of the TP region (:class:`~megatron_loop.parallel.vocab.TensorParallelEdges`).
* ``norm``      -- the block spec's RMSNorm (sequence parallel capable).
* ``grads``     -- the TP sum of the partial gradients of replicated parameters (the one path).
* ``parallelize`` -- prepares a built model for training: the TP gradient sum, activation recomputation,
  compiled blocks and what ZeRO-3 needs (torchtitan's ``parallelize_*``).
* ``shards``    -- a TP = 1 state dict to this rank's shards and back.
* ``mpu``       -- DeepSpeed's model-parallel unit: ZeRO over the data-parallel group only.
* ``muon``      -- Muon on TP-sharded matrices (gathered over TP, orthogonalised per projection).
* ``cpu``       -- megatron-core's TP collectives on CPU (gloo).
* ``plan``      -- the TP FLOP and byte model of ``--dry-run`` (no torch).
* (TP checkpoints: :mod:`megatron_loop.checkpoint.tensor_parallel`.)

The ``parallel:`` config section (``tensor_model_parallel_size``, ``sequence_parallel``) is
:mod:`megatron_loop.config.parallel`. The modules here import megatron-core (except ``plan``), so the
package imports none of them itself.
"""
