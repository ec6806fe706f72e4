"""``training/divergence.py``: the record of stops on non-finite values and the lr of the resume after one
(the runs themselves: tests/integration/reliability/test_nan.py)."""

from __future__ import annotations

import json

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.errors import LoopDataError
from megatron_loop.training.divergence import RECORD, lr_after_divergence


def _stops(root, *steps):
    root.mkdir(parents=True, exist_ok=True)
    (root / RECORD).write_text(json.dumps({"stops": [{"step": s, "saved": None, "resume_from": f"global_step{s - 2}"}
                                                     for s in steps]}))


def test_no_stop_recorded_changes_nothing(tmp_path):
    cfg = config_from_dict({"train": {"lr": 3e-3, "divergence_lr_factor": 0.5}})
    assert lr_after_divergence(cfg, tmp_path) == (cfg, None)


def test_the_lr_is_lowered_per_recorded_stop_only_when_asked(tmp_path):
    _stops(tmp_path, 12, 30)
    plain = config_from_dict({"train": {"lr": 4e-3}})
    same, note = lr_after_divergence(plain, tmp_path)
    assert same.train.lr == 4e-3
    assert note == (f"2 stops on non-finite values recorded in {tmp_path / RECORD} (the last at step 30, resuming from "
                    "global_step28): training at train.lr=0.004 as configured (set train.divergence_lr_factor to lower "
                    "it)")
    lowered, note = lr_after_divergence(config_from_dict({"train": {"lr": 4e-3, "divergence_lr_factor": 0.5}}), tmp_path)
    assert lowered.train.lr == pytest.approx(1e-3)  # 4e-3 x 0.5^2: the same on every later resume
    assert note.endswith("training at train.lr=0.004 x train.divergence_lr_factor=0.5^2 = 0.001")


def test_a_damaged_record_is_one_line(tmp_path):
    (tmp_path / RECORD).write_text("{not json")
    with pytest.raises(LoopDataError, match=rf"^{tmp_path / RECORD}: not a record of stops on non-finite values "):
        lr_after_divergence(config_from_dict({}), tmp_path)
