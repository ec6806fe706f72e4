"""``export/convert.py``'s name mapping and config, without files: a training state dict to the export's names
and back is the identity (fused QKV and fc1 split by rows and rebuilt), a tensor with no place in the export is
refused by name, and the config class follows the architecture (a NonLoop without conditioning is native)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopDataError
from megatron_loop.export.convert import from_hf_state_dict, hf_config, is_native, to_hf_state_dict
from megatron_loop.model import build_model


def _cfg(**kw):
    return build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3,
                                   coda_layers=1, **kw))


def test_training_names_to_export_names_and_back_is_the_identity():
    cfg = _cfg(initial_injection="dense", timestep="adaln", history_injection="scalar")
    state = {k: v for k, v in build_model(cfg).state_dict().items() if isinstance(v, torch.Tensor)}
    hf = to_hf_state_dict(state, cfg)
    assert "model.core.1.self_attn.k_proj.weight" in hf and "model.initial_injection.weight" in hf
    assert not any("linear_qkv" in k or "linear_fc1" in k for k in hf)
    back = from_hf_state_dict(hf, cfg)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_a_tensor_with_no_place_in_the_export_is_refused_by_name():
    cfg = _cfg()
    state = {k: v for k, v in build_model(cfg).state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(LoopDataError, match=r"^checkpoint tensor 'stray.weight' has no place in the export of 1\+2x3\+1"):
        to_hf_state_dict({**state, "stray.weight": torch.zeros(1)}, cfg)


def test_the_config_class_follows_the_architecture():
    assert type(hf_config(_cfg())).__name__ == "LoopLMConfig" and not is_native(_cfg())
    flat = build_model_config(dict(backbone="tiny-llama", core_layers=4, train_loops=1))
    assert is_native(flat) and type(hf_config(flat, train_seq_length=64)).__name__ == "LlamaConfig"
    assert hf_config(flat, train_seq_length=64).train_seq_length == 64
