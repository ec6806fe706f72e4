"""``model/initial_state.py``: Huginn's noise start as functions of their inputs alone (the recurrence run
from it, the export and cached decoding: tests/unit/model/test_huginn.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from megatron_loop.config.validation import NOISE_STATE_TP_REFUSAL
from megatron_loop.errors import LoopConfigError
from megatron_loop.model.initial_state import (check_tensor_parallel, huginn_adapter_init_, noise_state, state_std,
                                               step_seed)


def _config(**over):
    fields = dict(initial_state="noise", initial_state_std=None, initial_state_seed=7, max_position_embeddings=64)
    fields.update(over)
    return SimpleNamespace(**fields)


def test_sigma_is_huginns_unless_set():
    assert state_std(_config()) == pytest.approx(math.sqrt(2 / 5))
    assert state_std(_config(initial_state_std=0.25)) == 0.25


def test_step_seed_is_a_pure_function_of_its_coordinates():
    seeds = {step_seed(1, s, m, r) for s in range(3) for m in range(2) for r in range(2)}
    assert len(seeds) == 12 and step_seed(1, 2, 1, 0) == step_seed(1, 2, 1, 0)
    assert all(0 <= s < 2 ** 32 for s in seeds)
    assert step_seed(1, 0, 0, 0) != step_seed(2, 0, 0, 0)


def test_noise_refuses_tensor_parallelism():
    check_tensor_parallel(_config(), 1)
    check_tensor_parallel(_config(initial_state="prelude"), 4)
    with pytest.raises(LoopConfigError) as err:
        check_tensor_parallel(_config(), 2)
    assert str(err.value) == NOISE_STATE_TP_REFUSAL


def test_noise_state_layout_and_its_two_sources():
    h0 = torch.zeros(5, 3, 8, dtype=torch.bfloat16)  # [s, b, d]
    cfg = _config()
    drawn = noise_state(cfg, h0, seed=11)
    assert drawn.shape == (5, 3, 8) and drawn.dtype == torch.bfloat16
    assert torch.equal(drawn, noise_state(cfg, h0, seed=11)) and not torch.equal(drawn, noise_state(cfg, h0, seed=12))
    assert not torch.equal(drawn[:, 0], drawn[:, 1])  # iid over the batch
    keyed = noise_state(cfg, h0, seed=None)
    assert torch.equal(keyed[:, 0], keyed[:, 2])  # by position only: the same for every sequence
    assert torch.equal(noise_state(cfg, h0[:3], seed=None), keyed[:3])  # a prefix's positions get the same noise
    bound = 3 * state_std(cfg) * 1.01  # truncated at 3 sigma (bf16 rounding aside)
    assert drawn.float().abs().max() <= bound and keyed.float().abs().max() <= bound


def test_adapter_initialisation_is_truncated_at_three_std():
    torch.manual_seed(0)
    w = torch.empty(256, 512)
    huginn_adapter_init_(w)
    std = math.sqrt(2 / (5 * 256))
    assert w.abs().max() <= 3 * std
    assert w.std().item() == pytest.approx(std * 0.986, rel=0.05)  # a normal truncated at 3 sigma: 0.986 sigma
