"""The CPU-compatibility module (megatron_loop/model/compat.py): SDPA core attention, RoPE. (The process
groups megatron-core's RoPE reads: tests/unit/parallel/test_bootstrap.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rope

from megatron_loop.config import LLAMA3_ROPE_SCALING
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.model.compat import (SDPACoreAttention, rope_freqs, rope_inv_freq,
                                        transformer_config)

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


def test_sdpa_core_attention_equals_explicit_causal_gqa_softmax():
    torch.manual_seed(0)
    cfg = transformer_config(num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, qk_norm=False,
                             initializer_range=0.02)
    attn = SDPACoreAttention(cfg, layer_number=1)
    s, b = 7, 3
    q, k, v = torch.randn(s, b, 4, 8), torch.randn(s, b, 2, 8), torch.randn(s, b, 2, 8)
    out = attn(q, k, v, None)
    # reference: query head i uses kv group i // (heads / groups), causal softmax(QK^T / sqrt(d)) V
    ref = torch.empty(s, b, 4, 8)
    mask = torch.ones(s, s).tril().bool()
    for head in range(4):
        g = head // 2
        scores = torch.einsum("sbd,tbd->bst", q[:, :, head], k[:, :, g]) / math.sqrt(8)
        scores = scores.masked_fill(~mask, float("-inf"))
        ref[:, :, head] = torch.einsum("bst,tbd->sbd", scores.softmax(-1), v[:, :, g])
    assert out.shape == (s, b, 32)
    assert torch.allclose(out, ref.reshape(s, b, 32), atol=1e-5)


def test_llama3_rope_frequencies_equal_transformers():
    hf = LlamaConfig(hidden_size=1536, num_attention_heads=12, head_dim=128, max_position_embeddings=131072,
                     rope_parameters=dict(LLAMA3_ROPE_SCALING, rope_theta=5e5))
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, device=torch.device("cpu"))
    got = rope_inv_freq(128, 5e5, LLAMA3_ROPE_SCALING)
    assert torch.equal(got, want.float())
    plain = rope_inv_freq(128, 1e6, None)
    assert torch.allclose(plain, 1.0 / (1e6 ** (torch.arange(0, 128, 2).float() / 128)))


def test_rotate_half_layout_matches_transformers_apply():
    """megatron-core's apply_rotary_pos_emb on our [s,1,1,d] angles == HF's rotate-half RoPE."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    ensure_groups()  # megatron-core's RoPE reads the context-parallel group
    cfg = transformer_config(num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, qk_norm=False,
                             initializer_range=0.02)
    inv = rope_inv_freq(16, 1e4, None)
    freqs = rope_freqs(inv, 9, torch.device("cpu"))
    x = torch.randn(9, 2, 4, 16)  # [s, b, heads, d]
    ours = apply_rotary_pos_emb(x, freqs, config=cfg)
    cos, sin = freqs[:, 0, 0].cos(), freqs[:, 0, 0].sin()
    xh = x.permute(1, 2, 0, 3)  # [b, heads, s, d]
    ref, _ = hf_apply_rope(xh, xh, cos[None], sin[None])
    assert torch.allclose(ours, ref.permute(2, 0, 1, 3), atol=1e-6)

