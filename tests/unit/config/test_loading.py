"""``config/loading.py``: YAML configs load (every example under examples/, the paper's runs at their
sequence length and depth), ``--set`` overrides apply, an unknown key is one error, and
``pretrain_loop.py`` reports a bad config as one ``error:`` line with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megatron_loop import LoopConfigError, load_config
from megatron_loop.config import config_from_dict
from testpaths import REPO

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)

ROOT = REPO


def test_examples_cover_the_paper_and_load():
    names = {p.stem for p in (ROOT / "examples").rglob("*.yaml")}
    expected = {"llama_2x10", "llama_4x5", "llama_5x4", "llama_10x2", "qwen_2x14", "qwen_4x7", "qwen_7x4",
                "qwen_14x2", "llama_20x1", "qwen_28x1", "llama_0+1x19+1", "llama_1+1x19+0", "llama_0+2x9+2",
                "llama_1+2x9+1", "llama_2+2x9+0", "llama_0+3x6+2", "llama_1+3x6+1", "llama_2+3x6+0",
                "llama_0+5x3+5", "llama_1+5x3+4", "llama_2+5x3+3", "llama_3+5x3+2", "llama_4+5x3+1",
                "llama_5+5x3+0", "qwen_0+2x13+2", "qwen_1+2x13+1", "qwen_2+2x13+0"}
    assert expected <= names
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        cfg = load_config(path)
        if path.stem.startswith(("llama", "qwen")):
            assert cfg.train.seq_length == 2048
            assert cfg.model.effective_depth() == (20 if path.stem.startswith("llama") else 28)


def test_overrides_and_cli_error(tmp_path):
    cfg = load_config(ROOT / "examples/tiny_2x3.yaml", overrides=["model.train_loops=5", "train.lr=1e-3"])
    assert cfg.model.train_loops == 5 and cfg.train.lr == 1e-3
    with pytest.raises(LoopConfigError, match="train.nope: unknown key"):
        load_config(ROOT / "examples/tiny_2x3.yaml", overrides=["train.nope=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  backbone: tiny-llama\n  train_loops: 0\n")
    out = subprocess.run([sys.executable, "pretrain_loop.py", "--config", str(bad), "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f"error: {bad}: model.train_loops=0: expected an integer >= 1"


def test_the_old_recompute_keys_still_load_and_say_so_once(capsys, monkeypatch):
    """model.activation_checkpointing* were renamed model.recompute* (activation recomputation, not an on-disk
    checkpoint): a YAML or saved run config with the old names loads the same values, the first use says so
    once on stderr, and both names at once is one error."""
    from megatron_loop.config import loading

    monkeypatch.setattr(loading, "_said", set())
    old = {"model": {"backbone": "tiny-llama", "activation_checkpointing": "auto",
                     "activation_checkpointing_budget_gib": 2.5, "activation_checkpointing_selective_cost": 0.3}}
    cfg = config_from_dict(old)
    assert (cfg.model.recompute, cfg.model.recompute_budget_gib, cfg.model.recompute_selective_cost) == ("auto", 2.5, 0.3)
    first = capsys.readouterr().err
    assert "note: model.activation_checkpointing is now model.recompute" in first and first.count("note:") == 3
    assert config_from_dict(old, overrides=["model.activation_checkpointing_budget_gib=1"]).model.recompute_budget_gib == 1
    assert capsys.readouterr().err == ""  # once per process
    with pytest.raises(LoopConfigError, match=r"model.activation_checkpointing: the old name of model.recompute, both "
                                              r"given; expected only model.recompute"):
        config_from_dict({"model": {"activation_checkpointing": "none", "recompute": "per_loop"}})
