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
    none, per_loop, per_block = (build_model_config(dict(base, recompute=m))
                                 for m in ("none", "per_loop", "per_block"))
    block = block_forward_flops_per_token(none, seq)
    assert hardware_flops_per_token(none, seq) == train_flops_per_token(none, seq)
    assert hardware_flops_per_token(per_loop, seq) == train_flops_per_token(none, seq) + 4 * block  # loops 1..K-1
    assert hardware_flops_per_token(per_block, seq) == train_flops_per_token(none, seq) + 8 * block


def test_dense_injection_matmuls_are_counted():
    """Dense initial injection is concat(h, h0) @ W.T with W [d, 2d]: 2 * d * 2d FLOPs per token in every
    loop; dense history reads m_l = min(w, max(l - 1, 0)) lags before loop l, each a d x d matmul.
    Scalar and channel-wise conditioning are O(d) and not counted; truncated backprop counts the
    backward of the graphed loops' injection only."""
    from megatron_loop.flops import conditioning_flops_per_token

    base = dict(backbone="tiny-llama", core_layers=2, train_loops=4, hidden_size=8, intermediate_size=12,
                num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=10)
    seq, d = 6, 8
    plain = build_model_config(base)
    dense_i = build_model_config(dict(base, initial_injection="dense"))
    dense_h = build_model_config(dict(base, history_injection="dense", history_window=2))
    channel = build_model_config(dict(base, initial_injection="channel", history_injection="channel",
                                      history_window=2, timestep="loop_gating"))
    assert forward_flops_per_token(channel, seq) == forward_flops_per_token(plain, seq)
    assert forward_flops_per_token(dense_i, seq) == forward_flops_per_token(plain, seq) + 4 * (2 * d * 2 * d)
    # lags before loops 0..3 with w = 2: 0, 0, 1, 2 -> 3 d x d matmuls; at r = 6: 0, 0, 1, 2, 2, 2 -> 7
    assert forward_flops_per_token(dense_h, seq) == forward_flops_per_token(plain, seq) + 3 * 2 * d * d
    assert forward_flops_per_token(dense_h, seq, 6) == forward_flops_per_token(plain, seq, 6) + 7 * 2 * d * d
    assert train_flops_per_token(dense_i, seq) == 3 * forward_flops_per_token(dense_i, seq)
    # backprop through the last 2 of 4 loops: their injection's backward only
    truncated = train_flops_per_token(dense_h, seq, 4, backprop_loops=2)
    assert truncated - train_flops_per_token(plain, seq, 4, backprop_loops=2) == 3 * 2 * d * d + 2 * (3 * 2 * d * d)
    assert conditioning_flops_per_token(dense_h, range(2, 4)) == 3 * 2 * d * d
