"""The transformer block of every LoopLM: megatron-core SelfAttention + MLP in a pre-norm layer.

One block class serves Prelude, Core and Coda (App. C.1 "Backbone architectures"): RMSNorm
before attention and before the MLP, causal GQA self-attention with RoPE (and per-head QK
RMSNorm for Qwen3), SwiGLU MLP, no biases, no dropout. It is assembled from a megatron-core
``ModuleSpec`` (:func:`loop_block_spec`) so the attention/MLP implementations can be swapped
(e.g. for Transformer Engine modules on GPU) without touching the model. The spec names
megatron-core's modules with the fast path of ``fast_path.py`` (plain ``F.linear`` linears at TP = 1,
one SwiGLU Function, RoPE from tables made once per sequence length); ``fast_path=False`` gives
megatron-core's own modules throughout, the reference the fast path is tested against (same
parameters, names and layouts; the same loss, gradients up to summation order).

Core blocks may carry a timestep modulation per residual branch (BranchGating or AdaLN,
``conditioning.py``); the block then applies Eq. (branch_timestep_modulation),
``u+ = u + g * Branch((1 + s) * Norm(u))``, through the HF export's ``modulated_residual`` (one
implementation of the equation for training and export).

``model.block_norm: sandwich`` gives every block (Prelude, Core and Coda, as Huginn's ``SandwichBlock``
in all three; Geiping et al. 2025, seal-rg/recurrent-pretraining ``recpre/raven_modeling_minimal.py``)
a norm after each residual sum as well as before each branch:

    u' = Norm_2(u + Attn(Norm_1(u))),    u+ = Norm_4(u' + MLP(Norm_3(u')))

(``attn_residual_norm`` = norm_2, ``mlp_residual_norm`` = norm_4; the spec names them with the path's
norm class, so the fast path and megatron-core's reference path agree).

``model.block_norm: branch_output`` gives every block Ouro's norms on each branch's output before the residual
sum (Zhu et al. 2025, modeling_ouro.py:413-434, ``input_layernorm_2`` / ``post_attention_layernorm_2``):

    u' = u + Norm_2(Attn(Norm_1(u))),    u+ = u' + Norm_4(MLP(Norm_3(u')))

(``attn_output_norm``, ``mlp_output_norm``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from megatron_loop.hf.modeling_looplm import modulated_residual
from megatron_loop.model import roles
from megatron_loop.model.compat import RotaryTables, SDPACoreAttention
from megatron_loop.model.fast_path import ColumnLinear, RMSNorm, RopeSelfAttention, RowLinear, SwiGLUMLP
from megatron_loop.model.norm import TorchRMSNorm

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import TransformerConfig


@dataclass
class LoopBlockSubmodules:
    input_layernorm: ModuleSpec | type = TorchRMSNorm
    self_attention: ModuleSpec | type = IdentityOp
    pre_mlp_layernorm: ModuleSpec | type = TorchRMSNorm
    mlp: ModuleSpec | type = IdentityOp
    # Huginn's sandwich norms after each residual sum (model.block_norm: sandwich); IdentityOp: none
    attn_residual_norm: ModuleSpec | type = IdentityOp
    mlp_residual_norm: ModuleSpec | type = IdentityOp
    # Ouro's norms on each branch's output (model.block_norm: branch_output); IdentityOp: none
    attn_output_norm: ModuleSpec | type = IdentityOp
    mlp_output_norm: ModuleSpec | type = IdentityOp


def loop_block_spec(qk_norm: bool, fast_path: bool = True, sandwich: bool = False,
                    branch_output: bool = False) -> ModuleSpec:
    """megatron-core local spec of one block: fused QKV, SDPA core attention, fused SwiGLU fc1.

    With ``fast_path`` (the default, ``fast_path.py``) the linears follow the TP size of the config
    the block is built with: ``F.linear`` subclasses of megatron-core's linears at TP = 1,
    megatron-core's Column/RowParallelLinear at TP > 1; at every TP size the attention rotates q and
    k with the model's precomputed rotary tables, the MLP runs one SwiGLU Function on the fused fc1
    output and the norms are :class:`fast_path.RMSNorm`. ``fast_path=False``: megatron-core's modules
    only (the reference path; the same parameters, names, layouts and initial values). ``sandwich``:
    Huginn's norms after each residual sum (``model.block_norm``), of the same norm class; ``branch_output``:
    Ouro's norms on each branch's output.
    """
    column = ColumnLinear if fast_path else ColumnParallelLinear
    row = RowLinear if fast_path else RowParallelLinear
    norm = RMSNorm if fast_path else TorchRMSNorm
    return ModuleSpec(
        module=LoopBlock,
        submodules=LoopBlockSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=RopeSelfAttention if fast_path else SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=column,
                    core_attention=SDPACoreAttention,
                    linear_proj=row,
                    q_layernorm=norm if qk_norm else IdentityOp,
                    k_layernorm=norm if qk_norm else IdentityOp,
                ),
            ),
            pre_mlp_layernorm=norm,
            mlp=ModuleSpec(module=SwiGLUMLP if fast_path else MLP,
                           submodules=MLPSubmodules(linear_fc1=column, linear_fc2=row)),
            attn_residual_norm=norm if sandwich else IdentityOp,
            mlp_residual_norm=norm if sandwich else IdentityOp,
            attn_output_norm=norm if branch_output else IdentityOp,
            mlp_output_norm=norm if branch_output else IdentityOp,
        ),
    )


class LoopBlock(nn.Module):
    """Pre-norm (or Huginn's sandwich-norm) transformer block; optional per-branch timestep modulation
    (core blocks only)."""

    def __init__(self, config: TransformerConfig, submodules: LoopBlockSubmodules, layer_number: int = 1):
        super().__init__()
        d = config.hidden_size
        eps = config.layernorm_epsilon
        self.input_layernorm = build_module(submodules.input_layernorm, config=config, hidden_size=d, eps=eps)
        self.self_attention = build_module(submodules.self_attention, config=config, layer_number=layer_number)
        self.pre_mlp_layernorm = build_module(submodules.pre_mlp_layernorm, config=config, hidden_size=d, eps=eps)
        self.mlp = build_module(submodules.mlp, config=config)
        # None without sandwich norms: no parameters, and the pre-norm block's arithmetic unchanged
        self.attn_residual_norm, self.mlp_residual_norm, self.attn_output_norm, self.mlp_output_norm = (
            None if spec is IdentityOp else build_module(spec, config=config, hidden_size=d, eps=eps)
            for spec in (submodules.attn_residual_norm, submodules.mlp_residual_norm, submodules.attn_output_norm,
                         submodules.mlp_output_norm))
        # megatron-core's own attention takes the rotary angles; ours the precomputed tables
        self._rope_tables = isinstance(self.self_attention, RopeSelfAttention)
        # Timestep modulation of the two residual branches (set by the model for core blocks).
        self.attn_gate = self.mlp_gate = None  # BranchGating
        self.attn_adaln = self.mlp_adaln = None  # AdaLN
        self._tag_roles(config)

    def _tag_roles(self, config: TransformerConfig) -> None:
        heads, groups = config.num_attention_heads, config.num_query_groups
        tp = config.tensor_model_parallel_size  # the splits describe this rank's shard of the fused weights
        attn = self.self_attention
        roles.set_role(attn.linear_qkv.weight, roles.MATRIX,
                       roles.QKVSplit(num_groups=groups // tp, heads_per_group=heads // groups,
                                      head_dim=config.kv_channels))
        roles.set_role(attn.linear_proj.weight, roles.MATRIX)
        roles.set_role(self.mlp.linear_fc1.weight, roles.MATRIX, roles.GateUpSplit(config.ffn_hidden_size // tp))
        roles.set_role(self.mlp.linear_fc2.weight, roles.MATRIX)
        for norm in (self.input_layernorm, self.pre_mlp_layernorm, attn.q_layernorm, attn.k_layernorm,
                     self.attn_residual_norm, self.mlp_residual_norm, self.attn_output_norm, self.mlp_output_norm):
            for p in norm.parameters() if norm is not None else ():
                roles.set_role(p, roles.NORM)

    def set_timestep_modulation(self, attn: nn.Module | None, mlp: nn.Module | None, kind: str) -> None:
        """Attach BranchGating (``kind='branch_gating'``) or AdaLN modules to the two branches."""
        if kind == "branch_gating":
            self.attn_gate, self.mlp_gate = attn, mlp
        elif kind == "adaln":
            self.attn_adaln, self.mlp_adaln = attn, mlp

    def forward(self, hidden: torch.Tensor, rotary_pos_emb: RotaryTables | torch.Tensor,
                psi: torch.Tensor | None = None) -> torch.Tensor:
        """``hidden`` is ``[s, b, d]`` (megatron-core layout); ``rotary_pos_emb`` the model's
        :class:`RotaryTables` (or megatron-core's ``[s, 1, 1, head_dim]`` angles); ``psi`` the timestep
        features of this loop."""
        if isinstance(rotary_pos_emb, RotaryTables) and not self._rope_tables:
            rotary_pos_emb = rotary_pos_emb.freqs
        # u + g * Branch((1 + s) * Norm(u)), Eq. (branch_timestep_modulation): the export's one implementation
        # (megatron-core's branches return (output, bias); no bias here)
        hidden = modulated_residual(
            hidden, self.input_layernorm,
            lambda x: self.self_attention(x, attention_mask=None, rotary_pos_emb=rotary_pos_emb)[0],
            self.attn_gate or self.attn_adaln, psi, self.attn_residual_norm, self.attn_output_norm)
        return modulated_residual(hidden, self.pre_mlp_layernorm, lambda x: self.mlp(x)[0],
                                  self.mlp_gate or self.mlp_adaln, psi, self.mlp_residual_norm, self.mlp_output_norm)
