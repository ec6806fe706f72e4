"""Hugging Face export of LoopLMs: ``modeling_looplm.py`` (self-contained, shipped into every
export) and ``convert.py`` (DeepSpeed checkpoint <-> HF folder)."""

from megatron_loop.hf.convert import convert_checkpoint, export_state_dict, load_looplm_from_hf

__all__ = ["convert_checkpoint", "export_state_dict", "load_looplm_from_hf"]
