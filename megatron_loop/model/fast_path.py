"""The block's fast path: megatron-core's modules without the generic machinery this model never uses.

megatron-core builds one block for every parallel layout, fusion backend and inference mode; on our
path (no biases, no dropout, causal self-attention, eager or ``torch.compile``) some of its generic
steps cost time without changing a value. ``layers.loop_block_spec`` names these modules (its
``fast_path=False`` names megatron-core's own, the reference they are tested against):

* linears: at TP = 1 megatron-core's ``ColumnParallelLinear``/``RowParallelLinear`` run each matmul
  through a Python ``autograd.Function`` and two identity region Functions.
  :class:`SingleRankColumnLinear` / :class:`SingleRankRowLinear` are those classes (same
  ``__init__``: parameter, initialisation, TP attributes, ``_extra_state``, state-dict keys) whose
  ``forward`` is ``F.linear``; :class:`ColumnLinear` / :class:`RowLinear` pick them at TP = 1 and
  megatron-core's linears at TP > 1, by the config's TP size.
* token order: the residual stream is megatron-core's ``[s, b, d]`` over the embedding's ``[b, s, d]``
  memory (a transpose), and ``torch.matmul`` copies such an input into sequence-major rows before
  every linear (HF's ``[b, s, d]`` model does not). With single-rank linears the attention and the
  MLP here work on the ``[b, s, ...]`` view (:func:`batch_major`; the core attention still gets
  ``[s, b, ...]`` views): no copies, and SDPA reads batch-major q, k, v and writes an output the
  output projection takes as it is. Under TP > 1 the order stays megatron-core's (sequence
  parallelism shards the sequence dimension).
* SwiGLU: megatron-core's ``glu`` copies the up half (``up + glu_linear_offset``), runs SiLU and the
  product on strided halves of the fused fc1 output and ``cat``s the halves' gradients in backward.
  :func:`swiglu` is one ``autograd.Function`` on the fused ``[gate | up]`` output that keeps only the
  fused input and silu(gate) and writes both halves of the gradient into one buffer.
  ``linear_fc1.weight`` stays the one fused ``[2F, d]`` parameter (checkpoints, HF export and the TP
  stride-2 layout unchanged), and fc1 stays one matmul (the selective recomputation policy counts them).
* RoPE: megatron-core's ``apply_rotary_pos_emb`` takes cos and sin of the angles for q and again for k
  in every layer, copies the query (a ``reshape`` of a strided slice) and concatenates an empty
  pass-through slice (a copy of q and k). :class:`RopeSelfAttention` takes
  :class:`~megatron_loop.model.compat.RotaryTables` (cos and a signed sin, made once per sequence
  length by the model), splits the fused QKV output as megatron-core does but into views, and
  rotates q and k with one ``cat`` each (:func:`apply_rope`).
* RMSNorm: torch's CPU ``rms_norm`` composite multiplies the weight in place, which costs autograd a
  copy of the output; :class:`RMSNorm` is the same decomposition without it (torch's kernel off CPU).

Values: the forward (loss, logits) is bitwise megatron-core's in fp32 and bf16. Gradients are equal
up to summation order (the weight gradients sum over the tokens in memory order, batch-major here,
sequence-major in megatron-core): measured within 4e-7 of each tensor's largest entry in fp32 and
7e-6 in bf16 (``tests/unit/model/test_fast_path.py``). Memory: per block and token the fast path
keeps less -- no copy of the up half (F), no per-layer cos/sin tables (4 head_dim / batch), and
with QK-norm in fp32 no query copy (heads x head_dim); ``recompute.block_bytes_per_token``
models what it keeps.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from megatron_loop.model.compat import RotaryTables

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP


# ----------------------------------------------------------------------------- linears at TP = 1 and token order


def batch_major(t: Tensor) -> bool:
    """Whether ``t`` ``[s, b, ...]`` is laid out batch by batch in memory, as the model's residual
    stream is (megatron-core's ``[s, b, d]`` order over the embedding's ``[b, s, d]``, a transpose)."""
    return t.stride(0) < t.stride(1)


def linear_in_memory_order(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` over the rows of ``x`` in their memory order: on a batch-major
    ``[s, b, d]`` input ``F.linear`` would first copy it to sequence-major rows; here the rows stay
    where they are and the output is batch-major too (every row's values are the same). The attention
    and MLP below hand their linears ``[b, s, ...]`` views already; this covers other callers."""
    if x.dim() == 3 and batch_major(x):
        return F.linear(x.transpose(0, 1), weight).transpose(0, 1)
    return F.linear(x, weight)


def _single_rank(linear: torch.nn.Module) -> None:
    if linear.tp_group is not None and linear.tp_group.size() != 1:
        raise ValueError(f"{type(linear).__name__} is the TP = 1 linear; this tensor-parallel group has "
                         f"{linear.tp_group.size()} ranks (the spec names megatron-core's linears at TP > 1)")


class SingleRankColumnLinear(ColumnParallelLinear):
    """megatron-core's ``ColumnParallelLinear`` at TP = 1 with ``F.linear`` as its forward (the
    parameter, its initialisation and TP attributes and the state-dict keys are the parent's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _single_rank(self)

    def forward(self, input_: Tensor, weight: Tensor | None = None,
                runtime_gather_output: bool | None = None) -> tuple[Tensor, Tensor | None]:
        if weight is None:
            weight = self.weight
        output = linear_in_memory_order(input_, weight)
        if self.bias is not None and not self.skip_bias_add:
            output = output + self.bias  # as megatron-core adds it (not fused into the matmul)
        return output, self.bias if self.skip_bias_add else None


class SingleRankRowLinear(RowParallelLinear):
    """megatron-core's ``RowParallelLinear`` at TP = 1 with ``F.linear`` as its forward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _single_rank(self)

    def forward(self, input_: Tensor) -> tuple[Tensor, Tensor | None]:
        output = linear_in_memory_order(input_, self.weight)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None


class ColumnLinear:
    """The spec's column-parallel linear, chosen by ``config.tensor_model_parallel_size`` when built:
    :class:`SingleRankColumnLinear` at TP = 1, megatron-core's ``ColumnParallelLinear`` at TP > 1."""

    def __new__(cls, *args, config, **kwargs) -> ColumnParallelLinear:
        single = config.tensor_model_parallel_size == 1
        return (SingleRankColumnLinear if single else ColumnParallelLinear)(*args, config=config, **kwargs)


class RowLinear:
    """The spec's row-parallel linear: :class:`SingleRankRowLinear` at TP = 1, megatron-core's
    ``RowParallelLinear`` at TP > 1."""

    def __new__(cls, *args, config, **kwargs) -> RowParallelLinear:
        single = config.tensor_model_parallel_size == 1
        return (SingleRankRowLinear if single else RowParallelLinear)(*args, config=config, **kwargs)


# ----------------------------------------------------------------------------- RMSNorm


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` built from a megatron-core config (as ``model.norm.TorchRMSNorm``: the
    weight carries megatron-core's ``sequence_parallel`` attribute) whose CPU forward is the
    decomposition ``(x r) w`` with ``r = rsqrt(mean(x^2) + eps)`` computed in fp32: the values torch's
    CPU ``rms_norm`` composite gives, bit for bit in fp32 and bf16, and the tensors it keeps for
    backward, without its in-place weight multiply (which costs a copy of the output for autograd).
    Off CPU, torch's own (fused) kernel."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cpu:
            return super().forward(x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        up = x.float()
        return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + eps) * self.weight).to(x.dtype)


# ----------------------------------------------------------------------------- SwiGLU


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up of the fused ``[..., gate | up]`` tensor. Keeps the fused input and silu(gate);
    backward writes d gate and d up into the two halves of one buffer of the fused input's layout
    (under ``torch.compile``, which refuses ``out=`` views, a concatenation the compiler fuses)."""

    @staticmethod
    def forward(ctx, fused: Tensor) -> Tensor:
        gate, up = fused.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(fused, act)
        return act * up

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        fused, act = ctx.saved_tensors
        gate, up = fused.chunk(2, dim=-1)
        if torch.compiler.is_compiling():
            return torch.cat((torch.ops.aten.silu_backward(grad * up, gate), grad * act), dim=-1)
        d_fused = torch.empty_like(fused)
        d_gate, d_up = d_fused.chunk(2, dim=-1)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=d_gate)
        torch.mul(grad, act, out=d_up)
        return d_fused


def swiglu(fused: Tensor) -> Tensor:
    """SwiGLU of megatron-core's fused fc1 output ``[..., 2F]`` (gate first): ``[..., F]``."""
    return _SwiGLU.apply(fused)


class SwiGLUMLP(MLP):
    """megatron-core's ``MLP`` (gated, SiLU, no bias) with :func:`swiglu` as its activation."""

    def __init__(self, config, submodules, **kwargs):
        if not (config.gated_linear_unit and config.activation_func is F.silu and not config.add_bias_linear):
            raise ValueError("SwiGLUMLP: expected gated_linear_unit=True, activation_func=F.silu, no bias")
        super().__init__(config, submodules, **kwargs)
        self.any_token_order = (isinstance(self.linear_fc1, SingleRankColumnLinear)
                                and isinstance(self.linear_fc2, SingleRankRowLinear))

    def forward(self, hidden_states: Tensor, per_token_scale: Tensor | None = None, **kwargs):
        if per_token_scale is not None:
            return super().forward(hidden_states, per_token_scale, **kwargs)
        flip = self.any_token_order and batch_major(hidden_states)  # tokens in memory order (as the attention)
        intermediate, _ = self.linear_fc1(hidden_states.transpose(0, 1) if flip else hidden_states)
        out, bias = self.linear_fc2(swiglu(intermediate))
        return (out.transpose(0, 1) if flip else out), bias


# ----------------------------------------------------------------------------- RoPE


def apply_rope(t: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """Rotate-half RoPE of ``t`` ``[..., head_dim]`` (``cos``/``sin_signed`` broadcast to it): ``t cos +
    [t2, t1] sin_signed``, equal bit for bit to megatron-core's ``t cos + [-t2, t1] sin``
    (``sin_signed`` carries the minus sign)."""
    t1, t2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat((t2, t1), dim=-1) * sin_signed


class RopeSelfAttention(SelfAttention):
    """megatron-core's ``SelfAttention`` whose forward takes precomputed rotary tables.

    Called with :class:`RotaryTables` and nothing else (no mask, no inference context, no packed
    sequences: the only way the model calls it) it runs the fused QKV projection, splits it into
    query, key and value as megatron-core does (groups of ``[q heads of the group, k, v]``: the
    ``linear_qkv`` layout is unchanged) but into views (megatron-core's ``reshape`` of the query slice
    copies it), applies QK-norm when configured, :func:`apply_rope` to q and k, the core attention and
    the output projection. With single-rank linears it works in the memory order of its input
    (:func:`batch_major`: the model's residual stream is), so that nothing is copied to
    sequence-major rows and SDPA reads batch-major q, k, v. Any other call, and configurations this
    path does not cover (an output gate, more TP ranks than query groups, recomputed core attention,
    per-layer RoPE switches, interleaved or fused RoPE, YaRN), run megatron-core's own ``forward``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.config
        self.rope_tables_path = not (
            c.attention_output_gate or c.num_query_groups < self.world_size or self.checkpoint_core_attention
            or c.no_rope_freq or c.rotary_interleaved or c.apply_rope_fusion or c.fused_single_qkv_rope
            or c.multi_latent_attention or c.test_mode or hasattr(c, "yarn_rotary_scaling_factor"))
        # Only single-rank linears may see the tokens in another order (megatron-core's gather and
        # scatter the sequence dimension under sequence parallelism).
        self.any_token_order = (isinstance(self.linear_qkv, SingleRankColumnLinear)
                                and isinstance(self.linear_proj, SingleRankRowLinear))

    def _query_key_value(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``get_query_key_value_tensors`` without its query copy: query ``[t0, t1, groups, heads per
        group, head_dim]`` (a view), key and value ``[t0, t1, groups, head_dim]``, ``(t0, t1)`` the
        token dimensions of ``hidden_states``."""
        mixed, _ = self.linear_qkv(hidden_states)
        per_group = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        mixed = mixed.view(*mixed.shape[:-1], self.num_query_groups_per_partition, per_group + 2,
                           self.hidden_size_per_attention_head)
        query, key, value = torch.split(mixed, [per_group, 1, 1], dim=3)
        key, value = key.squeeze(3), value.squeeze(3)
        if self.q_layernorm is not None:
            query = self.q_layernorm(query)
        if self.k_layernorm is not None:
            key = self.k_layernorm(key)
        return query, key, value

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, *args,
                rotary_pos_emb=None, **kwargs):
        if (args or attention_mask is not None or not isinstance(rotary_pos_emb, RotaryTables)
                or not self.rope_tables_path or any(v is not None for v in kwargs.values())):
            if isinstance(rotary_pos_emb, RotaryTables):
                rotary_pos_emb = rotary_pos_emb.freqs
            return super().forward(hidden_states, attention_mask, *args, rotary_pos_emb=rotary_pos_emb, **kwargs)
        # [s, b, ...] over [b, s, ...] memory: work on [b, s, ...] (views), hand the core attention [s, b, ...]
        flip = self.any_token_order and batch_major(hidden_states)
        query, key, value = self._query_key_value(hidden_states.transpose(0, 1) if flip else hidden_states)
        cos, sin = rotary_pos_emb.cos.to(query.dtype), rotary_pos_emb.sin_signed.to(query.dtype)
        if flip:
            cos, sin = cos.transpose(0, 1), sin.transpose(0, 1)
        t0, t1, groups, per_group, head_dim = query.shape
        query = apply_rope(query, cos.unsqueeze(2), sin.unsqueeze(2)).view(t0, t1, groups * per_group, head_dim)
        key = apply_rope(key, cos, sin)
        if flip:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        out = self.core_attention(query, key, value, None, attn_mask_type=self.attn_mask_type,
                                  attention_bias=None, packed_seq_params=None)
        out, bias = self.linear_proj(out.transpose(0, 1) if flip else out)
        return (out.transpose(0, 1) if flip else out), bias
