"""Megatron-style tensor parallelism (+ sequence parallelism) for LoopLMs, above the model (docs/PARALLELISM.md).

* ``bootstrap``   -- the one place process groups are created: the launcher's world, megatron-core's
  TP / DP groups (both bounded by ``train.collective_timeout_s``), a world of one outside a launcher;
  :func:`~megatron_loop.parallel.bootstrap.init_model_parallel` returns this rank's placement.
* ``parallelize`` -- prepares a built model for training: the TP gradient sum, activation recomputation,
  compiled blocks and what ZeRO-3 needs (torchtitan's ``parallelize_*``).
* ``grads``       -- the TP sum of the partial gradients of replicated parameters (the one path).
* ``shards``      -- a TP = 1 tensor to this rank's shard and back.
* ``mpu``         -- DeepSpeed's model-parallel unit: ZeRO over the data-parallel group only.
* ``cpu``         -- megatron-core's TP collectives on CPU (gloo).
* ``per_rank``    -- the per-rank parameters, FLOPs, activation bytes and TP traffic of ``--dry-run`` (no torch).

What the model is built with lives in the model's folder: this rank's placement
(:mod:`megatron_loop.model.placement`), the vocabulary-parallel embedding, head and loss
(:mod:`megatron_loop.model.vocab`), the block spec's RMSNorm (:mod:`megatron_loop.model.norm`). Muon on TP
shards is the optimizer's (:mod:`megatron_loop.optim.muon_tp`), TP checkpoints the checkpoint format's
(:mod:`megatron_loop.checkpoint.tensor_parallel`). The ``parallel:`` config section is
:mod:`megatron_loop.config.parallel`. The modules here import megatron-core (except ``per_rank``), so the
package imports none of them itself.
"""
