"""``config/presets.py``: the backbone presets of App. C.1 (Table 1), every field overridable."""

from __future__ import annotations

import pytest

from megatron_loop.config import build_model_config

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


def test_backbone_presets_are_exact():
    llama = build_model_config(dict(backbone="llama3.1-1b"))
    assert (llama.hidden_size, llama.intermediate_size, llama.num_attention_heads, llama.num_key_value_heads,
            llama.head_dim, llama.vocab_size, llama.rms_norm_eps, llama.rope_theta, llama.tie_word_embeddings,
            llama.qk_norm) == (1536, 5376, 12, 3, 128, 128256, 1e-5, 5e5, False, False)
    assert llama.rope_scaling["rope_type"] == "llama3"
    assert llama.rope_scaling["original_max_position_embeddings"] == 8192
    qwen = build_model_config(dict(backbone="qwen3-0.6b"))
    assert (qwen.hidden_size, qwen.intermediate_size, qwen.num_attention_heads, qwen.num_key_value_heads,
            qwen.head_dim, qwen.vocab_size, qwen.rms_norm_eps, qwen.rope_theta, qwen.tie_word_embeddings,
            qwen.qk_norm, qwen.rope_scaling) == (1024, 3072, 16, 8, 128, 151936, 1e-6, 1e6, True, True, None)
    # every field overridable
    assert build_model_config(dict(backbone="qwen3-0.6b", hidden_size=512)).hidden_size == 512
