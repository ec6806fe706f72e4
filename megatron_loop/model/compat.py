"""Everything that lets megatron-core layers run on any device, CPU included.

megatron-core's local attention path, its RoPE module, its default causal mask and its CUDA
RNG tracker call CUDA. We avoid those paths, and keep the replacements here:

* :class:`SDPACoreAttention` -- a megatron-core ``core_attention`` submodule backed by
  ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention / memory-efficient
  kernels on GPU; never the unfused path that materialises the score matrix).
* :func:`rope_inv_freq` / :func:`rope_freqs` -- rotary frequencies computed on the input's
  device (Llama 3 scaling rule included), in megatron-core's ``[s, 1, 1, head_dim]``
  rotate-half layout, consumed by megatron-core's own ``apply_rotary_pos_emb``;
  :func:`rope_tables` -- the same angles with their cos and (signed) sin, computed once per
  sequence length, for the block's fast path (``fast_path.RopeSelfAttention``).
* :func:`transformer_config` -- a megatron-core ``TransformerConfig`` with CPU
  initialisation and every CUDA-only fusion off.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

with warnings.catch_warnings():  # megatron-core warns loudly when Apex/TE are absent
    warnings.simplefilter("ignore")
    from megatron.core.transformer.transformer_config import TransformerConfig


def transformer_config(*, num_layers: int, hidden_size: int, intermediate_size: int, num_attention_heads: int,
                       num_key_value_heads: int, head_dim: int, rms_norm_eps: float, qk_norm: bool,
                       initializer_range: float, params_dtype: torch.dtype = torch.float32,
                       tensor_model_parallel_size: int = 1, sequence_parallel: bool = False) -> TransformerConfig:
    """megatron-core config for a pre-norm RMSNorm / GQA / RoPE / SwiGLU block without biases or dropout
    (``tensor_model_parallel_size`` / ``sequence_parallel``: ``megatron_loop/parallel``)."""

    def init_method(weight: torch.Tensor) -> torch.Tensor:
        # App. C.2: every linear weight ~ N(0, 0.02); no depth scaling of output layers.
        return nn.init.normal_(weight, mean=0.0, std=initializer_range)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(
            num_layers=num_layers,
            hidden_size=hidden_size,
            ffn_hidden_size=intermediate_size,
            num_attention_heads=num_attention_heads,
            num_query_groups=num_key_value_heads,
            kv_channels=head_dim,
            normalization="RMSNorm",
            layernorm_epsilon=rms_norm_eps,
            qk_layernorm=qk_norm,
            add_bias_linear=False,
            add_qkv_bias=False,
            gated_linear_unit=True,
            activation_func=F.silu,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            init_method=init_method,
            output_layer_init_method=init_method,
            use_cpu_initialization=True,
            params_dtype=params_dtype,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            masked_softmax_fusion=False,
            persist_layer_norm=False,
            gradient_accumulation_fusion=False,
            rotary_interleaved=False,
            tensor_model_parallel_size=tensor_model_parallel_size,
            sequence_parallel=sequence_parallel,
        )


class SDPACoreAttention(nn.Module):
    """megatron-core ``core_attention`` submodule on ``F.scaled_dot_product_attention``.

    Inputs follow megatron-core: query ``[s, b, heads, d]``, key/value ``[s, b, groups, d]``;
    output ``[s, b, heads * d]``. Causal (no explicit mask is ever built); grouped-query
    attention through SDPA's ``enable_gqa``.
    """

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type=None, **_unused):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_groups = config.num_query_groups

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
            raise NotImplementedError("SDPACoreAttention supports causal attention over packed sequences only")
        s, b, h, d = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        gqa = self.num_groups != self.num_heads
        if gqa and q.is_cuda and q.dtype == torch.float32:
            # FlashAttention (bf16/fp16) broadcasts K/V heads itself; in fp32 only the unfused MATH
            # kernel accepts enable_gqa, so expand K/V and keep the memory-efficient kernel.
            k, v = (t.repeat_interleave(self.num_heads // self.num_groups, dim=1) for t in (k, v))
            gqa = False
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse rotary frequencies [head_dim / 2], with the Llama 3 scaling rule when given.

    Llama 3 rule: wavelengths longer than original_context / low_freq_factor are divided by
    ``factor``; shorter than original_context / high_freq_factor are kept; in between they
    are smoothly interpolated (identical to transformers' ``_compute_llama3_parameters``).
    """
    # float32 arithmetic exactly as transformers computes it, so exports match bit for bit.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_freqs(inv_freq: torch.Tensor, seq_len: int, device: torch.device) -> torch.Tensor:
    """Rotary angles for positions 0..seq_len-1 as megatron-core expects: ``[s, 1, 1, head_dim]``."""
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq.to(device=device, dtype=torch.float32))
    return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


class RotaryTables(NamedTuple):
    """What the blocks' attention rotates q and k with: the angles and their cos and sin, made once per
    sequence length (and device and dtype) instead of for q and for k in every layer.

    ``freqs``: fp32 angles ``[s, 1, 1, head_dim]`` (:func:`rope_freqs`; megatron-core's own attention
    takes these). ``cos``: ``cos(freqs)``; ``sin_signed``: ``sin(freqs)`` with its first half negated,
    so that ``t cos + [t2, t1] sin_signed`` is megatron-core's ``t cos + [-t2, t1] sin`` bit for bit
    (negation is exact); both cast to the activation dtype as megatron-core casts them.
    """

    freqs: torch.Tensor
    cos: torch.Tensor
    sin_signed: torch.Tensor


def rope_tables(freqs: torch.Tensor, dtype: torch.dtype = torch.float32) -> RotaryTables:
    """:class:`RotaryTables` of :func:`rope_freqs`'s angles, cos and sin in ``dtype`` (computed in fp32)."""
    cos = torch.cos(freqs).to(dtype)
    sin = torch.sin(freqs).to(dtype)
    half = sin.shape[-1] // 2
    return RotaryTables(freqs, cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1))


class _CompileSafeWarnings:
    """The ``warnings`` module, except that ``warn`` is a no-op while dynamo traces.

    megatron-core warns on every linear call (``get_tensor_model_parallel_group_if_none``:
    "tp_group is None") with a warning category argument that dynamo cannot reorder, so each
    call would split the compiled block into several graphs. The warning is about an API
    migration and carries no information at run time; eager calls still emit it.
    """

    def __getattr__(self, name: str):
        return getattr(warnings, name)

    @staticmethod
    def warn(*args, **kwargs) -> None:
        if not torch.compiler.is_compiling():
            warnings.warn(*args, **kwargs)


def make_megatron_compilable() -> None:
    """Remove the graph breaks megatron-core's per-call warnings cause under ``torch.compile``."""
    from megatron.core import utils as mcore_utils

    if not isinstance(mcore_utils.warnings, _CompileSafeWarnings):
        mcore_utils.warnings = _CompileSafeWarnings()
