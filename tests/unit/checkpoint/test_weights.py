"""``checkpoint/weights.py``: weights-only unpickling with DeepSpeed's allow-list (the consolidation of real
ZeRO checkpoints, every stage: tests/integration/training/test_checkpoint_format.py and test_init_from.py)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from data_fixtures import CodePayload
from megatron_loop.checkpoint.weights import deepspeed_safe_globals, restrict_unpickling, safe_load
from megatron_loop.optim.schedule import WSDMultiplier


def test_tensors_containers_and_the_schedule_round_trip(tmp_path):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "steps": [1, 2], "name": "x",
             "lr_lambda": WSDMultiplier(warmup=2, stable=5, decay=3)}
    torch.save(state, tmp_path / "s.pt")
    back = safe_load(tmp_path / "s.pt", map_location="cpu")
    assert torch.equal(back["w"], state["w"]) and back["steps"] == [1, 2] and back["name"] == "x"
    assert back["lr_lambda"] == state["lr_lambda"]


def test_deepspeed_classes_are_allowed():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    allowed = deepspeed_safe_globals()
    assert {LossScaler, DynamicLossScaler, ZeroStageEnum, WSDMultiplier, set} <= set(allowed)
    assert deepspeed_safe_globals() is allowed  # imported once


def test_a_checkpoint_carrying_code_does_not_run(tmp_path):
    marker = tmp_path / "ran"
    with open(tmp_path / "evil.pt", "wb") as f:
        torch.save({"module": CodePayload(str(marker))}, f)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        safe_load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_restrict_unpickling_routes_deepspeed_reads_through_safe_load(tmp_path):
    torch.save({"t": torch.ones(2)}, tmp_path / "ok.pt")
    with open(tmp_path / "evil.pt", "wb") as f:
        torch.save(CodePayload(str(tmp_path / "ran")), f)
    engine = SimpleNamespace(checkpoint_engine=SimpleNamespace(load=None))
    restrict_unpickling(engine)
    assert torch.equal(engine.checkpoint_engine.load(tmp_path / "ok.pt", map_location="cpu")["t"], torch.ones(2))
    with pytest.raises(pickle.UnpicklingError):
        engine.checkpoint_engine.load(tmp_path / "evil.pt")
    assert not (tmp_path / "ran").exists()
