"""The LoopLM model: megatron-core blocks, recurrence conditioning, parameter roles."""

from megatron_loop.model.looplm import LoopLM, LoopLMOutput, build_model

__all__ = ["LoopLM", "LoopLMOutput", "build_model"]
