"""FLOP accounting over the effective depth, against a hand count."""

from __future__ import annotations

from megatron_loop.config import build_model_config
from megatron_loop.flops import (block_forward_flops_per_token, forward_flops_per_token, hardware_flops_per_token,
                                 mfu, train_flops_per_token)


def test_forward_flops_hand_count():
    # 1+2x3+1: effective depth 1 + 2*3 + 1 = 8 block occurrences at K=3, 1 + 2*5 + 1 = 12 at r=5.
    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3,
                                  coda_layers=1, hidden_size=8, intermediate_size=12, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=4, vocab_size=10))
    seq = 6
    q_proj, kv_proj, o_proj, mlp = 8 * 8, 2 * 8 * 4, 8 * 8, 3 * 8 * 12   # 64, 64, 64, 288 -> 480 MACs
    block = 2 * (q_proj + kv_proj + o_proj + mlp) + 2 * 2 * seq * 2 * 4    # 960 + 192 = 1152
    head = 2 * 8 * 10                                                       # 160
    assert forward_flops_per_token(cfg, seq) == 8 * block + head == 9376
    assert forward_flops_per_token(cfg, seq, num_loops=5) == 12 * block + head
    assert train_flops_per_token(cfg, seq) == 3 * 9376
    assert mfu(1000.0, cfg, seq, peak_flops=3 * 9376 * 1000.0) == 1.0


def test_loop_and_nonloop_of_equal_depth_have_equal_flops():
    loop = build_model_config(dict(backbone="llama3.1-1b", core_layers=4, train_loops=5))
    flat = build_model_config(dict(backbone="llama3.1-1b", core_layers=20, train_loops=1))
    assert train_flops_per_token(loop, 2048) == train_flops_per_token(flat, 2048)


def test_hardware_flops_count_the_recomputed_forward():
    base = dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3, coda_layers=1)
    seq = 32
    none, per_loop, per_block = (build_model_config(dict(base, activation_checkpointing=m))
                                 for m in ("none", "per_loop", "per_block"))
    block = block_forward_flops_per_token(none, seq)
    assert hardware_flops_per_token(none, seq) == train_flops_per_token(none, seq)
    assert hardware_flops_per_token(per_loop, seq) == train_flops_per_token(none, seq) + 4 * block  # loops 1..K-1
    assert hardware_flops_per_token(per_block, seq) == train_flops_per_token(none, seq) + 8 * block
