"""The shipped tiny peer-design configs (README "On CPU": ``examples/tiny_huginn_1+2x5+1.yaml``,
``tiny_ouro_3x4.yaml``, ``tiny_loopformer_3x4.yaml``): each is the CPU twin of its Table 7 design (the model
section and the design's training keys equal the registry's ``table7_designs`` twin, so the two cannot drift
apart), and each trains as shipped, briefly, on the test corpus (the demo's data stands in for it at full
length): finite losses, validation at r = K/2, K, 2K, and the design's own mechanism at work."""

from __future__ import annotations

import math

import pytest
import yaml

from data_fixtures import data_assets
from megatron_loop.registry import STUDIES, toy_config
from megatron_loop.registry.render import toy_copies
from testpaths import REPO
from train_fixtures import check_ok, records, run_cli

pytestmark = pytest.mark.slow

SHIPPED = {"tiny_huginn_1+2x5+1": "toy_pilot_huginn_1+2x5+1_muon", "tiny_ouro_3x4": "toy_pilot_ouro_3x4_muon",
           "tiny_loopformer_3x4": "toy_pilot_loopformer_3x4_muon"}
# keys that say where a run reads and writes, not what it is
PLACES = {"output_dir"}


def _twin(name: str) -> dict:
    study = STUDIES["table7_designs"]
    toy, run_name, _ = next(c for c in toy_copies(study) if c[1] == name)
    return toy_config(toy, "runs/demo", dict(study.toy_train), run_name, dict(study.toy_model))


@pytest.mark.parametrize("config", sorted(SHIPPED))
def test_tiny_design_is_the_registry_twin_and_trains(config, tmp_path):
    shipped = yaml.safe_load((REPO / "examples" / f"{config}.yaml").read_text())
    twin = _twin(SHIPPED[config])
    assert shipped["model"] == {k: v for k, v in twin["model"].items() if k != "compile"}  # compile: auto either way
    assert {k: v for k, v in shipped["train"].items() if k not in PLACES} == \
        {k: v for k, v in twin["train"].items() if k not in PLACES}
    assert shipped["data"] == {**twin["data"], "train_prefixes": ["runs/demo/data/corpus"],
                               "valid_prefixes": ["runs/demo/data/corpus_valid"], "tokenizer": "runs/demo/tokenizer"}

    assets = data_assets()
    out = tmp_path / "run"
    result = run_cli("--config", f"examples/{config}.yaml", "--set", "train.max_steps=4", "--set",
                     "train.log_interval=1", "--set", "train.eval_interval=4", "--set", "train.save_interval=100",
                     "--set", f"train.output_dir={out}", "--set", f"data.train_prefixes=[{assets.prefix}]",
                     "--set", f"data.valid_prefixes=[{assets.prefix}_valid]", "--set", f"data.tokenizer={assets.tokenizer}")
    check_ok(result)
    steps = records(out, "train")
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in steps)
    k = shipped["model"]["train_loops"]
    (evaluation,) = records(out, "eval")
    assert {key for key in evaluation if key.startswith("val_loss_r")} == {f"val_loss_r{r}" for r in (k // 2, k, 2 * k)}
    if config.startswith("tiny_huginn"):  # Poisson-log-normal loop counts: r drawn per step
        assert all(r["train_loops"] >= 1 for r in steps) and len({r["train_loops"] for r in steps}) > 1
    assert "model: LoopLM tiny-qwen " + {"tiny_huginn_1+2x5+1": "1+2x5+1", "tiny_ouro_3x4": "0+3x4+0",
                                         "tiny_loopformer_3x4": "0+3x4+0"}[config] in result.stderr
