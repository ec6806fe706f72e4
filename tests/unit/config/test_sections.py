"""``config/sections.py``: what the config dataclasses derive (depths, layout, the blend, the validation
prefixes, compile resolved) and the JSON round trip of a whole config (the checks each section runs:
tests/unit/config/test_validation.py; loading: test_loading.py)."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_loop.config import config_from_dict
from megatron_loop.config.sections import SECTIONS, Config, DataConfig, ModelConfig
from megatron_loop.errors import LoopConfigError


def test_depths_and_layout():
    m = ModelConfig(prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3)
    assert (m.physical_depth, m.effective_depth(), m.effective_depth(5), m.layout) == (4, 8, 12, "1+2x3+1")


def test_compile_auto_follows_cuda():
    assert ModelConfig(compile="auto").compile_enabled == torch.cuda.is_available()
    assert ModelConfig(compile=False).compile_enabled is False and ModelConfig(compile=True).compile_enabled is True


def test_train_blend_and_validation_prefixes(tmp_path):
    assert DataConfig(train_prefixes=["a", "b"]).train_blend() == [("a", 1.0), ("b", 1.0)]
    assert DataConfig(train_prefixes=["a", "b"], train_weights=[3, 1]).train_blend() == [("a", 3.0), ("b", 1.0)]
    with pytest.raises(LoopConfigError) as err:
        DataConfig(train_prefixes=[]).train_blend()
    assert str(err.value) == ("data.train_prefixes: empty; expected at least one indexed dataset prefix (P for "
                              "P.bin/P.idx, written by tools/preprocess_data.py)")
    train = str(tmp_path / "p")
    assert DataConfig(train_prefixes=[train]).validation_prefixes() == []
    for ext in (".bin", ".idx"):
        (tmp_path / f"p_valid{ext}").write_bytes(b"")
    assert DataConfig(train_prefixes=[train]).validation_prefixes() == [train + "_valid"]  # the sibling by default
    assert DataConfig(train_prefixes=[train], valid_prefixes=["v"]).validation_prefixes() == ["v"]


def test_a_config_round_trips_through_its_json():
    cfg = config_from_dict({"model": {"core_layers": 3, "train_loops": 2}, "train": {"lr": 0.002},
                            "data": {"train_prefixes": ["x"]}, "logging": {"dynamics_interval": 0}})
    cfg.source = "run.yaml"
    d = json.loads(cfg.dumps())
    assert list(d) == list(SECTIONS) and "source" not in d
    assert d == cfg.to_dict()
    back = config_from_dict(d)
    assert isinstance(back, Config) and back.to_dict() == cfg.to_dict()
    assert (back.model.core_layers, back.train.lr, back.logging.dynamics_interval) == (3, 0.002, 0)
