"""Backbone presets (App. C.1, Table 1): the fields ``model.backbone`` fills in, which the other
``model:`` keys override."""

from __future__ import annotations

from typing import Any

LLAMA3_ROPE_SCALING = {
    # Llama 3 RoPE scaling rule (App. C.1): original context 8,192, max context 131,072.
    # factor/low/high are those of the Llama 3.1 release.
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

BACKBONES: dict[str, dict[str, Any]] = {
    # Llama3.1-1B: 20-layer reference, 1,007,482,368 parameters.
    "llama3.1-1b": dict(
        hidden_size=1536, intermediate_size=5376, num_attention_heads=12, num_key_value_heads=3,
        head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=dict(LLAMA3_ROPE_SCALING), max_position_embeddings=131072,
        qk_norm=False, tie_word_embeddings=False,
    ),
    # Qwen3-0.6B: 28-layer reference, 596,049,920 parameters.
    "qwen3-0.6b": dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
        max_position_embeddings=40960, qk_norm=True, tie_word_embeddings=True,
    ),
    # CPU-sized twins of the two families (same block structure, tiny widths).
    "tiny-llama": dict(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=dict(LLAMA3_ROPE_SCALING, original_max_position_embeddings=256),
        max_position_embeddings=4096, qk_norm=False, tie_word_embeddings=False,
    ),
    "tiny-qwen": dict(
        hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
        max_position_embeddings=4096, qk_norm=True, tie_word_embeddings=True,
    ),
}
