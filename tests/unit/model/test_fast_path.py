"""The block's fast path (``model/fast_path.py``) against megatron-core's own modules (the reference,
``fast_path=False``): the same parameters and state dict, the same loss bit for bit, the same
gradients up to summation order; each replacement against the megatron-core function it replaces;
the spec's linears follow the TP size."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from megatron_loop.config import build_model_config
from megatron_loop.model import build_model
from megatron_loop.model import fast_path
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.model.compat import (RotaryTables, rope_freqs, rope_inv_freq, rope_tables,
                                        transformer_config)
from megatron_loop.model.layers import loop_block_spec

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.spec_utils import build_module

DTYPES = [torch.float32, torch.bfloat16]
# Gradients of the two paths differ only in summation order (tokens in memory order vs sequence-major):
# bound per tensor relative to its largest entry (measured <= 4e-7 in fp32, <= 7e-6 in bf16).
GRAD_TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8}

@pytest.fixture(autouse=True, scope="module")
def megatron_groups():
    """megatron-core's own attention (the reference path, or blocks called with rotary angles) reads its
    process groups when it runs; the model is built without any (build_model creates none)."""
    ensure_groups()



def _pair(dtype, **model):
    cfg = build_model_config({**dict(backbone="tiny-qwen", prelude_layers=1, core_layers=2, coda_layers=1,
                                     train_loops=2), **model})
    models = []
    for fast in (True, False):
        torch.manual_seed(0)
        m = build_model(cfg, fast_path=fast).to(dtype)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # conditioning away from its identity start, so that it matters
            for p in m.parameters():
                if p.looplm_role == "conditioning":
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        models.append(m)
    return cfg, *models


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("model", [dict(backbone="tiny-llama"),
                                   dict(timestep="adaln"),
                                   dict(timestep="branch_gating", initial_injection="channel")],
                         ids=["llama", "qwen-adaln", "qwen-branch-gating"])
def test_fast_path_matches_megatron_core_modules(model, dtype):
    cfg, fast, reference = _pair(dtype, **model)
    assert type(fast.core[0].self_attention.linear_qkv) is fast_path.SingleRankColumnLinear
    assert type(reference.core[0].self_attention.linear_qkv) is ColumnParallelLinear
    # the same parameters, names, layouts, TP attributes and initial values (checkpoints, HF export)
    ours, theirs = fast.state_dict(), reference.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if torch.is_tensor(ours[k]))
    for (name, p), (_, q) in zip(fast.named_parameters(), reference.named_parameters()):
        for attr in ("tensor_model_parallel", "partition_dim", "partition_stride", "sequence_parallel",
                     "looplm_role"):
            assert getattr(p, attr, None) == getattr(q, attr, None), (name, attr)
    x = torch.randint(0, cfg.vocab_size, (2, 24))
    out_fast, out_ref = fast(x, labels=x), reference(x, labels=x)
    assert torch.equal(out_fast.loss, out_ref.loss) and torch.equal(out_fast.logits, out_ref.logits)
    out_fast.loss.backward()
    out_ref.loss.backward()
    for (name, p), (_, q) in zip(fast.named_parameters(), reference.named_parameters()):
        bound = GRAD_TOLERANCE[dtype] * q.grad.abs().max().item()
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=bound, msg=name)


def test_spec_linears_follow_the_tp_size():
    """One spec: F.linear linears at TP = 1, megatron-core's Column/RowParallelLinear at TP > 1 (the
    class is picked from the config the block is built with); fast_path=False: megatron-core's."""
    ensure_groups()
    spec = loop_block_spec(qk_norm=True)
    attention, mlp = spec.submodules.self_attention, spec.submodules.mlp
    assert attention.module is fast_path.RopeSelfAttention and mlp.module is fast_path.SwiGLUMLP
    config = transformer_config(num_layers=1, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6, qk_norm=True,
                                initializer_range=0.02)
    block = build_module(spec, config=config)
    assert type(block.self_attention.linear_qkv) is fast_path.SingleRankColumnLinear
    assert type(block.self_attention.linear_proj) is fast_path.SingleRankRowLinear
    assert type(block.mlp.linear_fc1) is fast_path.SingleRankColumnLinear
    assert type(block.mlp.linear_fc2) is fast_path.SingleRankRowLinear
    assert type(block.input_layernorm) is fast_path.RMSNorm
    two = transformer_config(num_layers=1, hidden_size=16, intermediate_size=24, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6, qk_norm=True,
                             initializer_range=0.02, tensor_model_parallel_size=2)
    linear = dict(init_method=two.init_method, bias=False, skip_bias_add=False)
    assert type(fast_path.ColumnLinear(16, 48, config=two, gather_output=False, **linear)) is ColumnParallelLinear
    assert type(fast_path.RowLinear(16, 16, config=two, input_is_parallel=True, **linear)) is RowParallelLinear
    reference = loop_block_spec(qk_norm=True, fast_path=False)
    assert reference.submodules.self_attention.module is SelfAttention and reference.submodules.mlp.module is MLP
    ref_attention = reference.submodules.self_attention.submodules
    assert ref_attention.linear_qkv is ColumnParallelLinear and ref_attention.linear_proj is RowParallelLinear


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch_major", [False, True], ids=["sequence-major", "batch-major"])
def test_rope_tables_equal_megatron_core_rope(dtype, batch_major):
    """apply_rope with the model's tables == megatron-core's apply_rotary_pos_emb bit for bit, forward
    and backward, in both memory orders of ``[s, b, heads, head_dim]``."""
    ensure_groups()
    s, b, h, d = 12, 3, 4, 16
    config = transformer_config(num_layers=1, hidden_size=h * d, intermediate_size=8, num_attention_heads=h,
                                num_key_value_heads=h, head_dim=d, rms_norm_eps=1e-6, qk_norm=False,
                                initializer_range=0.02)
    freqs = rope_freqs(rope_inv_freq(d, 5e5, None), s, torch.device("cpu"))
    tables = rope_tables(freqs, dtype)
    x = torch.randn(b, s, h, d).transpose(0, 1) if batch_major else torch.randn(s, b, h, d)
    x = x.to(dtype)
    grad = torch.randn(s, b, h, d, dtype=dtype)
    ours, theirs = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    out = fast_path.apply_rope(ours, tables.cos, tables.sin_signed)
    ref = apply_rotary_pos_emb(theirs, freqs, config=config)
    assert torch.equal(out, ref)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(ours.grad, theirs.grad)
    assert fast_path.batch_major(out) == batch_major  # rotated in memory order


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_swiglu_equals_megatron_core_glu(dtype):
    """swiglu == megatron-core's glu (silu(gate) * (up + glu_linear_offset)), forward and backward."""
    fused = torch.randn(7, 3, 2 * 24, dtype=dtype)
    grad = torch.randn(7, 3, 24, dtype=dtype)
    ours, theirs = fused.clone().requires_grad_(), fused.clone().requires_grad_()
    gate, up = theirs.chunk(2, dim=-1)
    ref = F.silu(gate) * (up + 0.0)
    out = fast_path.swiglu(ours)
    assert torch.equal(out, ref)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(ours.grad, theirs.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_rmsnorm_equals_torch_rmsnorm(dtype):
    """The fast path's RMSNorm == torch.nn.RMSNorm bit for bit (output, input and weight gradients)."""
    config = transformer_config(num_layers=1, hidden_size=32, intermediate_size=8, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, qk_norm=False,
                                initializer_range=0.02)
    ours, theirs = fast_path.RMSNorm(config, 32, eps=1e-6).to(dtype), torch.nn.RMSNorm(32, eps=1e-6).to(dtype)
    with torch.no_grad():
        weight = 1 + 0.1 * torch.randn(32)
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    x = 3 * torch.randn(5, 4, 32, dtype=dtype)
    grad = torch.randn(5, 4, 32, dtype=dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = ours(a), theirs(b)
    assert torch.equal(out, ref)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(a.grad, b.grad) and torch.equal(ours.weight.grad, theirs.weight.grad)
    assert ours.weight.sequence_parallel is False


def test_attention_given_plain_angles_runs_megatron_core_forward():
    """Called with megatron-core's ``[s, 1, 1, head_dim]`` angles (not the model's tables) the fast
    attention runs megatron-core's own forward: the same output as with the tables."""
    torch.manual_seed(0)
    model = build_model(build_model_config(dict(backbone="tiny-qwen", core_layers=1, train_loops=1)))
    attention = model.core[0].self_attention
    x = torch.randn(10, 2, model.config.hidden_size)
    tables = model._rope(10, x.device)
    assert isinstance(tables, RotaryTables)
    with torch.no_grad():
        fast = attention(x, None, rotary_pos_emb=tables)[0]
        plain = attention(x, None, rotary_pos_emb=tables.freqs)[0]
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-6)
