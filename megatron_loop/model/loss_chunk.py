"""How many tokens the chunked loss (:mod:`megatron_loop.model.loss`) computes at a time, without torch:
the memory model of a step (:func:`megatron_loop.model.recompute.loop_memory`) counts one chunk's
logits, and the plan's memory check (:mod:`megatron_loop.training.memory_plan`) runs it in
``--dry-run``, which imports no torch."""

# 4096 x 128k vocab is 2 GB of fp32 logits (plus the bf16 copy) -- large enough that the head matmul
# runs at full speed, small next to a 1B model's activations.
DEFAULT_CHUNK_TOKENS = 4096
