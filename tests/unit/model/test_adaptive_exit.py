"""``model/adaptive_exit.py``: the per-token exit of ``LoopLM.forward`` on its own layouts (tokens
``[s, b]``, megatron-core keys ``[s, b, groups, head_dim]``): the settings it accepts, a token that exits
keeps its state and its loop count, and the "latest" key/value policy reaches every core attention
through pre-hooks that are gone after the forward. (The model and the HF export exiting alike, bit for
bit at threshold 0: tests/integration/hf/test_adaptive_exit.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from megatron_loop.errors import LoopConfigError
from megatron_loop.model.adaptive_exit import TokenExit, check_exit


def test_check_exit_accepts_the_criteria_and_refuses_bad_settings():
    for criterion, threshold in (("none", 0.0), ("kl", 1e-3), ("cosine", 0)):
        check_exit(criterion, threshold)
    with pytest.raises(LoopConfigError,
                       match=r"^exit_criterion='entropy': expected one of \('none', 'kl', 'cosine', 'q_exit'\)$"):
        check_exit("entropy", 0.1)
    for threshold in (-1e-3, math.nan):
        with pytest.raises(LoopConfigError, match=rf"^exit_threshold={threshold!r}: expected a number >= 0$"):
            check_exit("kl", threshold)


def test_a_converged_token_exits_and_keeps_its_state_and_loop_count():
    torch.manual_seed(0)
    s, b, d = 3, 2, 8
    h0 = torch.randn(s, b, d)
    exits = TokenExit("cosine", 0.01, h0, readout=None)
    assert exits.kv_mask().shape == (s, b, 1, 1)
    h1 = torch.randn(s, b, d)
    h1[1, 0] = 3 * h0[1, 0]  # the same direction: cosine distance 0 < 0.01
    state = exits.step(h0, h1)
    assert torch.equal(state, h1) and exits.loops.tolist() == [[1, 1], [1, 1], [1, 1]]
    assert exits.active.tolist() == [[True, True], [False, True], [True, True]]
    h2 = torch.randn(s, b, d)
    state = exits.step(state, h2)
    assert torch.equal(state[1, 0], h1[1, 0])  # frozen at the loop it exited after
    assert torch.equal(state[0], h2[0]) and torch.equal(state[2], h2[2]) and torch.equal(state[1, 1], h2[1, 1])
    assert exits.loops.tolist() == [[2, 2], [1, 2], [2, 2]] and not exits.done


def test_kl_compares_the_readouts_of_successive_states():
    readout = nn.Linear(4, 5, bias=False)
    h0 = torch.randn(2, 1, 4)
    exits = TokenExit("kl", 1e-6, h0, readout)
    assert exits.threshold == 1e-6
    exits.step(h0, h0.clone())  # the same prediction: KL 0, every token exits
    assert exits.done and exits.loops.tolist() == [[1], [1]]


class _Echo(nn.Module):
    """A core attention that returns the keys and values it receives."""

    def forward(self, query, key, value, mask):
        return key, value


def _core(n: int) -> nn.ModuleList:
    blocks = nn.ModuleList()
    for _ in range(n):
        block = nn.Module()
        block.self_attention = nn.Module()
        block.self_attention.core_attention = _Echo()
        blocks.append(block)
    return blocks


def test_exited_tokens_lend_their_latest_keys_and_values_to_every_core_attention():
    torch.manual_seed(0)
    s, b = 3, 2
    exits = TokenExit("cosine", 0.5, torch.randn(s, b, 4), readout=None)
    core = _core(2)
    attention = [block.self_attention.core_attention for block in core]
    q = torch.randn(s, b, 2, 4)
    first, second = [(torch.randn(s, b, 1, 4), torch.randn(s, b, 1, 4)) for _ in range(2)]
    with exits.latest_kv(core):
        k, v = attention[0](q, *first, None)  # loop 1: every token computes its keys
        assert torch.equal(k, first[0]) and torch.equal(v, first[1])
        exits.active[0, 1] = False  # token 0 of sequence 1 exits
        k, v = attention[0](q, *second, None)
        assert torch.equal(k[0, 1], first[0][0, 1]) and torch.equal(v[0, 1], first[1][0, 1])  # its latest
        keep = torch.ones(s, b, dtype=torch.bool)
        keep[0, 1] = False
        assert torch.equal(k[keep], second[0][keep]) and torch.equal(v[keep], second[1][keep])
        k, _ = attention[1](q, *second, None)  # layer 1 has no keys of that token yet: its own
        assert torch.equal(k, second[0])
    assert all(not a._forward_pre_hooks for a in attention)
    k, _ = attention[0](q, *second, None)
    assert torch.equal(k, second[0])  # outside the forward: no policy
