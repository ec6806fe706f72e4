"""training/init_from.py, the weights-only start (``train.init_from``): which checkpoints a model may start
from (names and shapes, ``train.init_from_missing``), the copy of whole weights into a model, and the keys'
own checks. The runs themselves (Ouro Stage I -> Stage II, ZeRO, the resume that ignores init_from):
tests/integration/training/test_init_from.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from megatron_loop.config import build_model_config
from megatron_loop.config.sections import Config, TrainConfig
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.model.looplm import build_model
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.init_from import check_parameters, choose_source, copy_whole_weights

WHERE = Path("/runs/stage1/train/checkpoints/looplm_config.json")
GATE = ["exit_gate.weight", "exit_gate.bias"]


def _cfg(missing: str = "error", **model) -> Config:
    gate = model.get("exit_gate") == "learned"
    train = TrainConfig(init_from="/runs/stage1/train/checkpoints", init_from_missing=missing,
                        exit_gate_objective="adaptive_gate" if gate else "none")
    values = dict(backbone="tiny-llama", core_layers=1, train_loops=2, vocab_size=96, recompute="none")
    return Config(model=build_model_config({**values, **model}), train=train)


def test_a_checkpoint_of_the_same_parameters_is_accepted_and_other_ones_are_refused_with_one_line():
    ouro, plain = _cfg(exit_gate="learned"), _cfg()
    assert check_parameters(ouro, ouro, WHERE) == []  # Stage I -> Stage II: the gate exists in Stage I
    assert check_parameters(_cfg(exit_gate="learned", train_loops=4), ouro, WHERE) == []  # K is no parameter
    # the model lacks a parameter of the checkpoint: always refused
    with pytest.raises(LoopConfigError, match=r"^/runs/stage1/train/checkpoints/looplm_config.json: the checkpoint's "
                                              r"parameter exit_gate.weight \[1, 64\] is not in the model of this config; "
                                              r"the configs differ in model.exit_gate 'learned' -> 'none'; expected a "
                                              r"checkpoint of this architecture \(train.init_from\)$"):
        check_parameters(ouro, plain, WHERE)
    with pytest.raises(LoopConfigError, match=r"parameter embed_tokens.weight has shape \[96, 64\] in the "
                                              r"checkpoint, \[128, 64\] in the model of this config; the configs "
                                              r"differ in model.vocab_size 96 -> 128; "):
        check_parameters(plain, _cfg(vocab_size=128), WHERE)
    # the checkpoint lacks parameters of the model: refused by default, kept at init with keep_init
    with pytest.raises(LoopConfigError, match=r"looplm_config.json: the checkpoint lacks 2 parameters of the model of "
                                              r"this config \(exit_gate.weight, exit_gate.bias\); the configs differ "
                                              r"in model.exit_gate 'none' -> 'learned'; set "
                                              r"train.init_from_missing=keep_init to start them"):
        check_parameters(plain, ouro, WHERE)
    assert check_parameters(plain, _cfg("keep_init", exit_gate="learned"), WHERE) == GATE


def test_whole_weights_are_copied_and_missing_parameters_keep_their_initialisation():
    torch.manual_seed(1)
    source = build_model(_cfg().model)
    torch.manual_seed(2)
    model = build_model(_cfg(exit_gate="learned").model)
    gate = {k: v.clone() for k, v in model.exit_gate.state_dict().items()}
    state = {k: v.detach().clone() for k, v in source.state_dict().items() if isinstance(v, torch.Tensor)}
    assert copy_whole_weights(model, state, WHERE.parent / "global_step2") == GATE
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert all(torch.equal(model.exit_gate.state_dict()[k], v) for k, v in gate.items())
    # a weight that does not fit the model the run config describes: a damaged checkpoint, one line
    state["norm.weight"] = torch.ones(3)
    with pytest.raises(LoopDataError, match=r"global_step2: weight norm.weight \[3\] does not fit the model its "
                                            r"looplm_config.json describes"):
        copy_whole_weights(model, state, WHERE.parent / "global_step2")


def test_the_keys_are_checked_at_load():
    for train, match in ((TrainConfig(init_from=" "), r"^train.init_from=' ': expected null or the path of another run's "
                                                      r"checkpoint folder"),
                         (TrainConfig(init_from="x", init_from_missing="keep"),
                          r"^train.init_from_missing='keep': expected one of \('error', 'keep_init'\)"),
                         (TrainConfig(init_from_missing="keep_init"),
                          r"^train.init_from_missing='keep_init': expected its default 'error' unless train.init_from")):
        with pytest.raises(LoopConfigError, match=match):
            Config(train=train).validate()


def test_a_folder_that_holds_no_checkpoint_is_refused_naming_the_key_and_a_resume_ignores_the_key(tmp_path):
    ensure_groups()  # a world of one: rank 0 decides, as under a launcher
    cfg, info, missing = _cfg(), DistInfo(rank=0, world_size=1, local_rank=0), tmp_path / "nope"
    cfg.train.init_from = str(missing)
    assert choose_source(cfg, True, info) is None  # the run resumes its own checkpoint
    with pytest.raises(LoopDataError, match=f"^{re.escape(f'train.init_from={str(missing)!r}: {missing}')}: "
                                            "checkpoint folder not found$"):
        choose_source(cfg, False, info)
