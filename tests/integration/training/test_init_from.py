"""A weights-only start (``train.init_from``, training/init_from.py) through the real DeepSpeed engine (ZeRO 1,
fp32, one rank): Ouro's Stage II (``train.exit_gate_objective: adaptive_gate``) from a Stage I run's checkpoint
starts from Stage I's final weights and trains the exit gate only, at step 1 with a fresh optimizer; a gate
added to a plain run keeps its initialisation only with ``train.init_from_missing: keep_init``; a second launch
resumes the run's own checkpoint and ignores init_from; another architecture is refused with one line before
the run folder exists. The checks of names and shapes themselves: tests/unit/training/test_init_from.py."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_loop.checkpoint.weights import consolidated_state_dict
from train_fixtures import check_ok, final_weights, launch_all, losses, records, run_cli, tiny_config

GATE = ("exit_gate.weight", "exit_gate.bias")
STAGE_I = dict(model={"exit_gate": "learned"}, train={"exit_gate_objective": "entropy_regularized"})
STAGE_II = dict(model={"exit_gate": "learned"}, train={"exit_gate_objective": "adaptive_gate"})


def _config(directory, name, spec, **train):
    return tiny_config(directory, f"{name}.yaml", model=spec.get("model", {}),
                       train={"max_steps": 2, "save_interval": 100, "eval_interval": 0,
                              "output_dir": str(directory / name), **spec.get("train", {}), **train})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-step sources (a plain run and Ouro's Stage I) side by side, then side by side: Stage II from
    Stage I (stopped after step 1, ``train.exit_interval``) and a gate-only run from the plain one (keep_init)."""
    root = tmp_path_factory.mktemp("init_from")
    sources = {"plain": _config(root, "plain", {}), "stage1": _config(root, "stage1", STAGE_I)}
    launch_all(root, {name: (1, ["pretrain_loop.py", "--config", str(c)]) for name, c in sources.items()})
    started = {
        "stage2": _config(root, "stage2", STAGE_II, init_from=str(root / "stage1" / "checkpoints"), exit_interval=1),
        "gated": _config(root, "gated", STAGE_II, max_steps=1, init_from_missing="keep_init",
                         init_from=str(root / "plain" / "checkpoints" / "global_step2")),  # one tag folder
    }
    launch_all(root, {name: (1, ["pretrain_loop.py", "--config", str(c)]) for name, c in started.items()})
    return root, {**sources, **started}


def _step1(run_dir):
    return consolidated_state_dict(run_dir / "checkpoints", "global_step1")


def test_stage_two_starts_from_stage_one_weights_and_trains_the_gate_only(runs):
    root, _ = runs
    stage1, stage2 = final_weights(root / "stage1"), _step1(root / "stage2")
    assert stage1.keys() == stage2.keys()
    assert [k for k in stage1 if not torch.equal(stage1[k], stage2[k])] == list(GATE)  # only the gate changed
    assert sorted(losses(root / "stage2")) == [1]  # a fresh step counter: the first step is 1
    start = records(root / "stage2", "start")[0]
    source = {"path": str(root / "stage1" / "checkpoints" / "global_step2"), "step": 2, "run": "stage1"}
    assert start["step"] == 0 and start["init_from"] == source
    assert f"weights from {source['path']} (step 2 of run stage1; train.init_from)" in (root / "stage2.log").read_text()
    manifest = json.loads((root / "stage2" / "checkpoints" / "global_step1" / "manifest.json").read_text())
    assert manifest["init_from"] == source and manifest["consumed_samples"] == 8  # the data position starts fresh
    config = json.loads((root / "stage2" / "checkpoints" / "looplm_config.json").read_text())
    assert config["train"]["init_from"] == str(root / "stage1" / "checkpoints")


def test_a_gate_added_to_a_plain_run_keeps_its_initialisation_with_keep_init(runs):
    root, _ = runs
    plain, gated = final_weights(root / "plain"), final_weights(root / "gated")
    assert set(gated) - set(plain) == set(GATE)
    assert all(torch.equal(plain[k], gated[k]) for k in plain)  # the LM is Stage II's frozen plain model
    log = (root / "gated.log").read_text()
    assert "kept at their initialisation (train.init_from_missing=keep_init): exit_gate.weight, exit_gate.bias" in log


def test_a_second_launch_resumes_its_own_checkpoint_and_ignores_init_from(runs):
    root, configs = runs
    resumed = run_cli("--config", str(configs["stage2"]))
    check_ok(resumed)
    assert (f"train.init_from='{root / 'stage1' / 'checkpoints'}' ignored: resuming this run's own checkpoint"
            in resumed.stderr)
    assert "weights from" not in resumed.stderr
    assert sorted(losses(root / "stage2")) == [1, 2]
    assert "init_from" not in records(root / "stage2", "start")[-1]
    stage1, stage2 = final_weights(root / "stage1"), final_weights(root / "stage2")
    assert [k for k in stage1 if not torch.equal(stage1[k], stage2[k])] == list(GATE)
    manifest = json.loads((root / "stage2" / "checkpoints" / "global_step2" / "manifest.json").read_text())
    assert manifest["init_from"]["run"] == "stage1"  # the lineage stays recorded


def test_another_architecture_is_refused_with_one_line_and_nothing_written(runs):
    root, _ = runs
    config = _config(root, "wider", STAGE_II, init_from=str(root / "stage1" / "checkpoints"))
    refused = run_cli("--config", str(config), "--set", "model.vocab_size=768")
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {root / 'stage1' / 'checkpoints' / 'looplm_config.json'}: parameter embed_tokens.weight "
                      "has shape [640, 64] in the checkpoint, [768, 64] in the model of this config; the configs differ "
                      "in model.vocab_size 640 -> 768; expected a checkpoint of this architecture (train.init_from)"]
    assert not (root / "wider").exists()
