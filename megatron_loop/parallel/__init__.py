"""Tensor (megatron-core) x data (DeepSpeed ZeRO) parallelism of a LoopLM."""
