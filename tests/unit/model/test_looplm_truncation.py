"""Truncated backpropagation: ``backprop_loops=N`` runs the first r - N loops
without a graph. Gradients equal a reference that runs every loop with a graph and detaches the
state and the history states by hand; nothing before h_{r-N} enters the graph; recomputation
(every mode, planned over the graphed loops) changes nothing; N >= r is full backpropagation bit for bit; the FLOP count covers what runs."""

from __future__ import annotations

import pytest
import torch

from megatron_loop import LoopConfigError, build_model
from megatron_loop.config import build_model_config
from megatron_loop.flops import block_forward_flops_per_token, hardware_flops_per_token, train_flops_per_token
from megatron_loop.model.recompute import RecomputeSettings
from megatron_loop.parallel.parallelize import apply_recompute
from megatron_loop.model.conditioning import history_window

CONDITIONED = dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3,
                   vocab_size=256, initial_injection="channel", history_injection="scalar", history_window=2,
                   timestep="loop_gating", recompute="none")


def _model(**overrides):
    torch.manual_seed(0)
    model = build_model(build_model_config({**CONDITIONED, **overrides}))
    for p in model.parameters():  # conditioning away from its identity initialisation
        if p.looplm_role == "conditioning":
            torch.nn.init.normal_(p, std=0.1)
    return model


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _hand_detached_loss(model, x, r, n):
    """The recurrence written out with every loop in the graph; the state after loop r-n and every
    history state of the first r-n loops are detached by hand."""
    h = model.embed_tokens(x).transpose(0, 1)
    rope = model._rope(x.shape[1], x.device)
    for block in model.prelude:
        h = block(h, rope)
    h0, completed = h, []
    psi_all = model._timestep_features(r, "rescaled", x.device)
    for step in range(r):
        h = model.loop_iteration(h, h0, rope, psi_all[step], *history_window(completed, 2))
        if step < r - n:
            h = h.detach()
        completed = completed[-2:] + [h]
    for block in model.coda:
        h = block(h, rope)
    return model.loss(model.norm(h).transpose(0, 1), x)


@pytest.mark.parametrize("r,n", [(4, 1), (5, 2)])
def test_gradients_equal_a_hand_detached_reference(r, n):
    model = _model()
    x = torch.randint(0, 256, (2, 12))
    _hand_detached_loss(model, x, r, n).backward()
    reference = _grads(model)
    assert reference["embed_tokens.weight"].abs().sum() > 0  # h0 reaches the graphed loops by injection
    for mode in ("none", "per_loop", "selective", "auto", "per_block"):  # and recomputation changes nothing
        model.zero_grad(set_to_none=True)
        # auto: the budget fits nothing, so the smallest-peak plan
        apply_recompute(model, RecomputeSettings(mode, 1e-6 if mode == "auto" else None))
        model(x, num_loops=r, labels=x, backprop_loops=n).loss.backward()
        got = _grads(model)
        assert got.keys() == reference.keys(), mode
        for name, g in reference.items():
            assert torch.equal(got[name], g), (mode, name)


def test_detached_loops_contribute_nothing():
    """Only the last N loops are in the graph: h_{r-N} is a constant, and backward runs each
    core block exactly N times (once per graphed loop)."""
    model = _model()
    x = torch.randint(0, 256, (2, 12))
    r, n = 5, 2
    calls = {k: 0 for k in range(len(model.core))}
    for k, block in enumerate(model.core):
        block.register_full_backward_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
    out = model(x, num_loops=r, labels=x, backprop_loops=n, return_trajectory=True)
    out.loss.backward()
    assert [t.requires_grad for t in out.trajectory] == [True] + [False] * (r - n) + [True] * n
    assert calls == {k: n for k in calls}
    # the same forward values as without truncation: the state flows through the detached loops
    torch.testing.assert_close(out.loss, model(x, num_loops=r, labels=x).loss, rtol=0, atol=0)


def test_full_window_is_full_backpropagation_bit_for_bit():
    model = _model()
    x = torch.randint(0, 256, (2, 12))
    model(x, labels=x).loss.backward()
    full = _grads(model)
    for n in (3, 7):  # N >= r = K
        model.zero_grad(set_to_none=True)
        model(x, labels=x, backprop_loops=n).loss.backward()
        got = _grads(model)
        assert all(torch.equal(got[k], g) for k, g in full.items())
    with pytest.raises(LoopConfigError, match="backprop_loops=0"):
        model(x, labels=x, backprop_loops=0)


def test_flops_count_the_executed_forward_and_backward():
    # 1+2x3+1 at r = 5, N = 2: forward of 1 + 10 + 1 blocks; backward of 1 + 4 + 1 blocks; head both ways.
    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3,
                                  coda_layers=1, hidden_size=8, intermediate_size=12, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=4, vocab_size=10))
    seq = 6
    block, head = block_forward_flops_per_token(cfg, seq), 2 * 8 * 10
    assert block == 1152  # the hand count of tests/unit/test_flops.py
    assert train_flops_per_token(cfg, seq, 5, backprop_loops=2) == (12 * block + head) + 2 * (6 * block + head)
    assert train_flops_per_token(cfg, seq, 5, backprop_loops=5) == train_flops_per_token(cfg, seq, 5) == 3 * (
        12 * block + head)
    per_loop = build_model_config({**cfg.__dict__, "recompute": "per_loop"})
    per_block = build_model_config({**cfg.__dict__, "recompute": "per_block"})
    base = train_flops_per_token(cfg, seq, 5, backprop_loops=2)
    assert hardware_flops_per_token(per_loop, seq, 5, backprop_loops=2) == base + 2 * block  # graphed loops but the last
    assert hardware_flops_per_token(per_block, seq, 5, backprop_loops=2) == base + 6 * block  # graphed blocks
    selective = build_model_config({**cfg.__dict__, "recompute": "selective"})
    auto = build_model_config({**cfg.__dict__, "recompute": "auto"})
    # selective: the attention output and down projections (2 x (8 x 8 + 12 x 8) per token) of the
    # graphed loops but the last (1 loop of 2 blocks)
    assert hardware_flops_per_token(selective, seq, 5, backprop_loops=2) == base + 2 * 2 * (8 * 8 + 12 * 8)
    assert hardware_flops_per_token(auto, seq, 5, backprop_loops=2) == base + 2 * block  # bound: per_loop's
    assert hardware_flops_per_token(auto, seq, 5, full_loops=0, backprop_loops=2) == base
    assert hardware_flops_per_token(auto, seq, 5, full_loops=0, selective_loops=1, backprop_loops=2) == (
        hardware_flops_per_token(selective, seq, 5, backprop_loops=2))
