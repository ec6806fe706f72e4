"""``config/deepspeed.py``, the DeepSpeed JSON's one owner: where the file is (``locate``), reading it
(``read_ds_config``), its ZeRO stage, the copy that loads a universal checkpoint, a run's settings read
and resolved once against the YAML (``DeepSpeedSettings``) and the batch arithmetic it fills in
(``resolve_ds_config``). The same checks through ``--dry-run``: tests/integration/cli/test_deepspeed_json.py."""

from __future__ import annotations

import json
import os

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.config.deepspeed import (CONFIG_DIR, DeepSpeedSettings, locate, read_ds_config,
                                            resolve_ds_config, with_universal_load, zero_stage)
from megatron_loop.errors import LoopConfigError
from testpaths import REPO

RUN = dict(micro_batch_size=38, grad_accum=6, data_parallel_size=8, bf16=True, grad_clip=1.0)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shipped_configs_resolve(stage):
    config = resolve_ds_config(read_ds_config(zero_stage=stage), **RUN)
    assert config["zero_optimization"]["stage"] == stage
    # App. C.2: 38 x 6 micro-batches on 8 GPUs = 1,824 sequences
    assert config["train_batch_size"] == 1824
    assert config["train_micro_batch_size_per_gpu"] == 38 and config["gradient_accumulation_steps"] == 6
    assert config["gradient_clipping"] == 1.0 and config["bf16"]["enabled"] is True
    assert config["zero_allow_untested_optimizer"] is True
    assert "optimizer" not in config and "scheduler" not in config
    assert "auto" not in str(config)


def test_cpu_fp32_override_and_stage0():
    config = resolve_ds_config(read_ds_config(zero_stage=1), **{**RUN, "bf16": False})
    assert config["bf16"]["enabled"] is False
    stage0 = resolve_ds_config(read_ds_config(zero_stage=0), **{**RUN, "bf16": False})
    assert stage0["gradient_clipping"] == 0.0  # the optimizer clips (and reports) at stage 0
    with pytest.raises(LoopConfigError, match="bf16 needs ZeRO"):
        resolve_ds_config(read_ds_config(zero_stage=0), **RUN)


def test_batch_arithmetic_is_checked_not_duplicated():
    config = {**read_ds_config(zero_stage=2), "train_batch_size": 1000}
    with pytest.raises(LoopConfigError, match="disagrees"):
        resolve_ds_config(config, **RUN)
    config = {**read_ds_config(zero_stage=2), "train_batch_size": 1824, "gradient_accumulation_steps": 6}
    assert resolve_ds_config(config, **RUN)["train_batch_size"] == 1824
    with pytest.raises(LoopConfigError, match="gradient_clipping"):
        resolve_ds_config({**read_ds_config(zero_stage=2), "gradient_clipping": 0.5}, **RUN)


def test_config_may_not_name_an_optimizer_or_scheduler():
    with pytest.raises(LoopConfigError, match="optimizer"):
        resolve_ds_config({**read_ds_config(zero_stage=1), "optimizer": {"type": "Muon"}}, **RUN)
    with pytest.raises(LoopConfigError, match="ZeRO stage 3, expected 2"):
        read_ds_config(read_ds_config(zero_stage=3), zero_stage=2)


# ----------------------------------------------------------------------------- the file


def test_locate_prefers_the_base_folder_then_the_shipped_configs(tmp_path):
    assert CONFIG_DIR == REPO / "deepspeed_configs"
    # not in tmp_path: the repository's shipped file
    assert locate("deepspeed_configs/zero2.json", tmp_path) == str(REPO / "deepspeed_configs" / "zero2.json")
    own = tmp_path / "deepspeed_configs" / "zero2.json"
    own.parent.mkdir()
    own.write_text("{}")
    assert locate("deepspeed_configs/zero2.json", tmp_path) == str(own)  # the base folder's own file wins
    assert locate("deepspeed_configs/../deepspeed_configs/zero2.json", tmp_path) == str(own)  # normalised
    assert locate("missing/zero9.json", tmp_path) == "missing/zero9.json"  # as written, for the error
    assert locate(str(tmp_path / "nowhere.json")) == str(tmp_path / "nowhere.json")  # absolute: untouched


def test_locate_defaults_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "ds.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert locate("ds.json") == str(tmp_path / "ds.json")


def test_read_ds_config_from_a_stage_a_file_or_a_dict(tmp_path):
    assert read_ds_config(zero_stage=0) == {"zero_optimization": {"stage": 0}}
    assert read_ds_config(zero_stage=3) == json.loads((REPO / "deepspeed_configs" / "zero3.json").read_text())
    given = {"zero_optimization": {"stage": 2, "overlap_comm": True}}
    copy = read_ds_config(given)
    copy["zero_optimization"]["stage"] = 1
    assert given["zero_optimization"]["stage"] == 2  # a deep copy: the caller's dict is untouched
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(given))
    assert read_ds_config(path, zero_stage=2) == given
    with pytest.raises(LoopConfigError, match=r"^DeepSpeed config .*nothere.json not found$"):
        read_ds_config(tmp_path / "nothere.json")
    with pytest.raises(LoopConfigError, match="give zero_stage or ds_config"):
        read_ds_config()


def test_zero_stage_and_the_universal_load_copy():
    assert [zero_stage(c) for c in ({}, {"zero_optimization": None}, {"zero_optimization": {}},
                                    read_ds_config(zero_stage=3))] == [0, 0, 0, 3]
    config = {"zero_optimization": {"stage": 1}, "checkpoint": {"tag_validation": "Fail"}}
    universal = with_universal_load(config)
    assert universal == {"zero_optimization": {"stage": 1},
                         "checkpoint": {"tag_validation": "Fail", "load_universal": True}}
    assert config["checkpoint"] == {"tag_validation": "Fail"}  # the run's own config is unchanged
    assert with_universal_load({})["checkpoint"] == {"load_universal": True}


# ----------------------------------------------------------------------------- a run's file


def _run(tmp_path, ds, **train):
    path = tmp_path / "ds.json"
    path.write_text(ds if isinstance(ds, str) else json.dumps(ds))
    return config_from_dict({"model": {"backbone": "tiny-llama"},
                             "train": {"deepspeed_config": str(path), "micro_batch_size": 2,
                                       "global_batch_size": 16, "seq_length": 64, **train}})


def test_run_settings_reports_stage_and_who_chose_the_precision(tmp_path):
    shipped = json.loads((REPO / "deepspeed_configs" / "zero2.json").read_text())
    report = DeepSpeedSettings.of_run(_run(tmp_path, shipped), accumulation=4, data_parallel_size=2).report()
    assert report == {"deepspeed_config": str(tmp_path / "ds.json"), "zero_stage": 2, "precision": "auto",
                      "precision_from": "train.precision auto and bf16.enabled auto: bf16 with CUDA, fp32 without"}
    yaml_decides = DeepSpeedSettings.of_run(_run(tmp_path, shipped, precision="fp32"), 4, 2).report()
    assert (yaml_decides["precision"], yaml_decides["precision_from"]) == ("fp32", "train.precision")
    json_decides = DeepSpeedSettings.of_run(_run(tmp_path, {**shipped, "bf16": {"enabled": True}}), 4, 2).report()
    assert (json_decides["precision"], json_decides["precision_from"]) == (
        "bf16", "bf16.enabled of train.deepspeed_config")
    # the batch arithmetic is the run's: 2 x 4 x 2 = 16, against a JSON that says otherwise
    with pytest.raises(LoopConfigError, match=r"train_batch_size=32 disagrees with micro 2 x accum 4 x "
                                              r"data-parallel 2 \(= global 16\)"):
        DeepSpeedSettings.of_run(_run(tmp_path, {**shipped, "train_batch_size": 32}), 4, 2)


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", r"not a DeepSpeed JSON config \(a JSON list\); expected a JSON object"),
    ("{stage: 1", r"not a DeepSpeed JSON config \(Expecting property name"),
])
def test_run_settings_refuses_what_is_not_a_json_object(tmp_path, text, message):
    with pytest.raises(LoopConfigError, match=message):
        DeepSpeedSettings.of_run(_run(tmp_path, text), 4, 2)


def test_run_settings_names_a_missing_file(tmp_path):
    cfg = _run(tmp_path, {})
    os.remove(cfg.train.deepspeed_config)
    with pytest.raises(LoopConfigError, match=r"train.deepspeed_config='.*ds.json': file not found \(relative paths "
                                              r"are taken from .*, then the repository\)"):
        DeepSpeedSettings.of_run(cfg, 4, 2)


def test_run_settings_hold_the_json_as_read_and_resolved_once_with_the_device_known(tmp_path):
    shipped = json.loads((REPO / "deepspeed_configs" / "zero1.json").read_text())
    cfg = _run(tmp_path, shipped)  # train.precision auto, bf16.enabled auto: the device decides
    gpu = DeepSpeedSettings.of_run(cfg, accumulation=4, data_parallel_size=2, cuda=True)
    assert gpu.raw == shipped and gpu.path == cfg.train.deepspeed_config
    assert (gpu.zero_stage, gpu.precision, gpu.bf16) == (1, "bf16", True)
    assert gpu.resolved == resolve_ds_config(shipped, micro_batch_size=2, grad_accum=4, data_parallel_size=2,
                                             bf16=None, grad_clip=1.0, cuda=True)
    assert gpu.resolved["train_batch_size"] == 16 and gpu.resolved["bf16"]["enabled"] is True
    cpu = DeepSpeedSettings.of_run(cfg, 4, 2, cuda=False)
    assert (cpu.precision, cpu.resolved["bf16"]["enabled"]) == ("fp32", False)
    # the file changing after the start does not change the start's settings; the engine gets a copy
    (tmp_path / "ds.json").write_text(json.dumps({**shipped, "train_batch_size": 32}))
    config = gpu.engine_config()
    config["train_batch_size"] = 0
    assert gpu.resolved["train_batch_size"] == 16
    universal = gpu.with_universal_load()
    assert universal.resolved["checkpoint"] == {"load_universal": True} and "checkpoint" not in gpu.resolved
    assert universal.raw == gpu.raw and universal.zero_stage == 1
