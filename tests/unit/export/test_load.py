"""``export/load.py``: an export folder checked before ``from_pretrained`` reads it (a missing config.json,
a truncated or unreadable safetensors file, one error line each), and a tiny export read back as the training
LoopLM with its weights (the loop sweep's and the probes' loaders)."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopDataError
from megatron_loop.export.convert import export_state_dict
from megatron_loop.export.load import _safetensors_header, check_export, export_config, load_looplm_from_hf
from megatron_loop.model import build_model


def test_a_folder_that_is_no_export_is_one_error(tmp_path):
    with pytest.raises(LoopDataError, match=r"config.json: missing; expected a folder written by tools/convert_to_hf.py"):
        export_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(LoopDataError, match=r"config.json: not readable JSON"):
        export_config(tmp_path)


def test_truncated_and_foreign_safetensors_files_are_named(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    whole = len(header).to_bytes(8, "little") + header + bytes(16)
    (tmp_path / "ok.safetensors").write_bytes(whole)
    assert _safetensors_header(tmp_path / "ok.safetensors") == {"w": [2, 2]}
    (tmp_path / "cut.safetensors").write_bytes(whole[:-4])
    with pytest.raises(LoopDataError, match=r"cut.safetensors: truncated"):
        _safetensors_header(tmp_path / "cut.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"not a header")
    with pytest.raises(LoopDataError, match=r"text.safetensors: not a readable safetensors file"):
        _safetensors_header(tmp_path / "text.safetensors")


def test_an_export_reads_back_as_the_training_model(tmp_path):
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=2, timestep="loop_gating"))
    model = build_model(cfg)
    state = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    folder = export_state_dict(state, cfg, tmp_path / "hf")
    assert check_export(folder)["model_type"] == "looplm"
    back = load_looplm_from_hf(folder)
    assert not back.training and all(torch.equal(back.state_dict()[k], state[k]) for k in state)
