"""Tensor-parallel checkpoints refused where their slices cannot be used (in-process, no launch).

A checkpoint records its TP x DP layout in the manifest (``tensor_parallel``); a resume at
another TP size, or at TP > 1 on another number of data-parallel ranks, stops before DeepSpeed
reads a byte with one line naming the setting; an export of a TP checkpoint whose manifest is
missing (or lacks a rank's files) stops with one line too. The TP = 2 save, resume and export
themselves are exercised by tests/integration/parallel/test_tp_train.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.checkpoint.selection import SelectedCheckpoint
from megatron_loop.checkpoint.weights import read_weights
from megatron_loop.checkpoint.tensor_parallel import check_resume
from megatron_loop.training.resume import decide_resume


def manifest(tp: int, dp: int) -> dict:
    return {"tensor_parallel": {"size": tp, "data_parallel_size": dp, "sharded": {}}, "zero_stage": 1,
            "world_size": tp * dp}


def test_resume_at_another_tp_size_is_refused_with_one_line(tmp_path):
    point = SelectedCheckpoint(tmp_path, "global_step10", manifest(2, 1))
    cfg = config_from_dict({"model": {"backbone": "tiny-llama"}})  # TP = 1 (no parallel groups here)
    with pytest.raises(LoopConfigError) as err:
        decide_resume(point, cfg, world_size=2, zero_stage=1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'global_step10' / 'manifest.json'}: written with "
                              "parallel.tensor_model_parallel_size=2, resumed with 1;")
    assert "--set parallel.tensor_model_parallel_size=2" in message


def test_tp_checkpoint_resumes_only_on_its_data_parallel_size():
    check_resume(manifest(2, 2), Path("m.json"), tp=2, dp=2)  # same layout: fine
    check_resume(None, Path("m.json"), tp=1, dp=3)  # a checkpoint from before TP: TP = 1
    with pytest.raises(LoopConfigError, match=r"written by 2 data-parallel x 2 tensor-parallel ranks, resumed "
                                              r"with 1 x 2; a tensor-parallel checkpoint resumes only on the same "
                                              r"layout \(4 ranks\)"):
        check_resume(manifest(2, 2), Path("m.json"), tp=2, dp=1)
    with pytest.raises(LoopConfigError, match="tensor_model_parallel_size=1, resumed with 2"):
        check_resume(manifest(1, 2), Path("m.json"), tp=2, dp=1)


def test_export_of_tp_shards_needs_every_rank_and_the_manifest(tmp_path):
    tag = tmp_path / "global_step4"
    tag.mkdir()
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"")
    with pytest.raises(LoopDataError, match=r"global_step4: no files of tensor-parallel rank 1 \(mp_rank_01_\*\); "
                                            r"the manifest records 2 ranks"):
        read_weights(SelectedCheckpoint(tmp_path, "global_step4", manifest(2, 1)))
    (tag / "mp_rank_01_model_states.pt").write_bytes(b"")
    with pytest.raises(LoopDataError, match=r"tensor-parallel shards \(mp_rank_01_\*\) without manifest.json"):
        read_weights(SelectedCheckpoint(tmp_path, "global_step4", None))


def test_a_model_key_newer_than_the_checkpoint_reads_as_its_default(tmp_path):
    """A checkpoint written before model.loop_norm existed resumes under a config at the default; the key set
    away from its default is another architecture (one line naming it)."""
    from megatron_loop.checkpoint.manifest import model_signature

    cfg = config_from_dict({"model": {"backbone": "tiny-llama"}})
    older = {k: v for k, v in model_signature(cfg).items() if k != "loop_norm"}
    point = SelectedCheckpoint(tmp_path, "global_step10", {**manifest(1, 1), "model": older})
    decide_resume(point, cfg, world_size=1, zero_stage=1)
    with pytest.raises(LoopConfigError, match=r"checkpoint is for a different architecture: model\.loop_norm=False "
                                              r"in the checkpoint, True in the config"):
        decide_resume(point, config_from_dict({"model": {"backbone": "tiny-llama", "loop_norm": True}}),
                      world_size=1, zero_stage=1)
