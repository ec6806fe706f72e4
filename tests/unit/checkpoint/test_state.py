"""``checkpoint/state.py``: what a checkpoint carries besides DeepSpeed's state, for a resume that
continues bit for bit: the loop counters (DeepSpeed's ``client_state``) and the Python, numpy and torch
RNG states, stored as plain containers that ``torch.load(weights_only=True)`` reads back."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from megatron_loop.checkpoint.state import RNG_FILE, TrainState, capture_rng, restore_rng
from megatron_loop.errors import LoopDataError


def test_train_state_round_trips_through_the_client_state():
    state = TrainState(step=12, consumed_samples=96, skipped_updates=2, consecutive_nonfinite=1)
    client = state.client_state()
    assert client == {"looplm_train_state": {"step": 12, "consumed_samples": 96, "skipped_updates": 2,
                                             "consecutive_nonfinite": 1}}
    assert TrainState.from_client_state(client, "ckpt") == state
    numpy_ints = {"looplm_train_state": {k: np.int64(v) for k, v in client["looplm_train_state"].items()}}
    restored = TrainState.from_client_state(numpy_ints, "ckpt")
    assert restored == state and all(type(v) is int for v in vars(restored).values())


@pytest.mark.parametrize("client", [None, {}, {"looplm_train_state": [1, 2]}])
def test_a_checkpoint_without_the_training_state_is_named(client):
    with pytest.raises(LoopDataError, match=r"^runs/x/global_step4: no training state in the DeepSpeed "
                                            r"client_state; expected a checkpoint written by pretrain_loop.py$"):
        TrainState.from_client_state(client, "runs/x/global_step4")


def _draws():
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_rng_states_restore_every_stream_after_a_weights_only_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()  # move the streams somewhere other than a seed
    path = tmp_path / RNG_FILE.format(rank=3)
    assert path.name == "rng_state_rank3.pt"
    torch.save(capture_rng(), path)
    expected = _draws()
    assert _draws() != expected  # the streams moved on
    restore_rng(torch.load(path, weights_only=True))  # plain containers: no pickled numpy state
    assert _draws() == expected
