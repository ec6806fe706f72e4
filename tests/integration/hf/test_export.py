"""HF export: DeepSpeed checkpoint (ZeRO 1 and 3) -> HF folder -> same logits.

The exports are loaded in ONE fresh process with HF_HUB_OFFLINE=1 (``hf_scripts/check_hf_logits.py``)
and compared with the training model loaded from the same checkpoint, at r = 1, K and 2K.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from data_fixtures import REPO, CodePayload
from hf_fixtures import CLI_EXPORTED, MODELS, eval_loops, hf_assets, offline_env
from testpaths import HF_SCRIPTS

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)

TOLERANCE = 1e-5
PREFIX_GRID_MODEL = "base_qwen_dense"  # AdaLN, K = 3


def _input_ids() -> torch.Tensor:
    return torch.randint(0, 600, (2, 12), generator=torch.Generator().manual_seed(3))


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def assets():
    return hf_assets()


@pytest.fixture(scope="module")
def training_models(assets):
    from megatron_loop.export.load import load_model_from_checkpoint

    return {name: load_model_from_checkpoint(assets.checkpoints[name])[0] for name in MODELS}


@pytest.fixture(scope="module")
def fresh_process_report(assets, training_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logits")
    ids = _input_ids()
    cases = {}
    for name, model in training_models.items():
        with torch.no_grad():
            logits = {r: model(ids, num_loops=r).logits for r in eval_loops(name)}
        torch.save({"input_ids": ids, "logits": logits}, tmp / f"{name}.pt")
        cases[name] = {"path": str(assets.exports[name]), "native": MODELS[name][1]["train_loops"] == 1,
                       "reference": str(tmp / f"{name}.pt")}
    # the prefix timestep grid (T = K, r <= K) chosen by a from_pretrained kwarg
    grid_model = training_models[PREFIX_GRID_MODEL]
    with torch.no_grad():
        logits = {r: grid_model(ids, num_loops=r, timestep_grid="prefix").logits for r in (1, 2)}
    torch.save({"input_ids": ids, "logits": logits}, tmp / "prefix.pt")
    cases[f"{PREFIX_GRID_MODEL}@prefix"] = {"path": str(assets.exports[PREFIX_GRID_MODEL]), "native": False,
                                            "reference": str(tmp / "prefix.pt"), "kwargs": {"timestep_grid": "prefix"}}
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = subprocess.run([sys.executable, str(HF_SCRIPTS / "check_hf_logits.py"),
                          str(tmp / "cases.json")], capture_output=True, text=True, env=offline_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [n for n in MODELS if MODELS[n][1]["train_loops"] > 1])
def test_looplm_export_logits_match_training_model(fresh_process_report, name):
    report = fresh_process_report[name]
    assert report["class"] == "LoopLMForCausalLM" and report["model_type"] == "looplm"
    assert report["dtype"] == "torch.float32"
    assert set(report["rel_error"]) == {str(r) for r in eval_loops(name)}
    for r, err in report["rel_error"].items():
        assert err < TOLERANCE, f"{name} r={r}: relative error {err}"


def test_timestep_grid_is_a_from_pretrained_kwarg(fresh_process_report):
    report = fresh_process_report[f"{PREFIX_GRID_MODEL}@prefix"]
    assert report["timestep_grid"] == "prefix"
    assert all(err < TOLERANCE for err in report["rel_error"].values()), report
    assert fresh_process_report[PREFIX_GRID_MODEL]["timestep_grid"] == "rescaled"


def test_the_two_timestep_grids_differ_below_k(training_models):
    """Otherwise the prefix-grid comparison above would test nothing."""
    model, ids = training_models[PREFIX_GRID_MODEL], _input_ids()
    with torch.no_grad():
        assert not torch.allclose(model(ids, num_loops=2, timestep_grid="prefix").logits,
                                  model(ids, num_loops=2).logits)


@pytest.mark.parametrize("name,cls", [("nonloop_llama", "LlamaForCausalLM"), ("nonloop_qwen", "Qwen3ForCausalLM")])
def test_nonloop_exports_load_natively_and_match(assets, fresh_process_report, name, cls):
    report = fresh_process_report[name]
    assert report["class"] == cls
    assert report["rel_error"]["1"] < TOLERANCE
    folder = assets.exports[name]
    config = json.loads((folder / "config.json").read_text())
    assert "auto_map" not in config and not (folder / "modeling_looplm.py").exists()


def test_export_folder_contract(assets):
    """config.json names, auto_map, self-contained modeling file, shards, tokenizer, generation config."""
    folder = assets.exports[CLI_EXPORTED]
    config = json.loads((folder / "config.json").read_text())
    fields = MODELS[CLI_EXPORTED][1]
    assert config["model_type"] == "looplm"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_looplm.LoopLMForCausalLM"
    assert config["auto_map"]["AutoConfig"] == "modeling_looplm.LoopLMConfig"
    for key in ("prelude_layers", "core_layers", "train_loops", "initial_injection", "history_injection",
                "history_window", "timestep"):
        assert config[key] == fields[key], key
    assert config["num_loops"] == fields["train_loops"] and config["coda_layers"] == 0
    assert config["timestep_grid"] == "rescaled" and config["rope_parameters"]["rope_type"] == "llama3"
    source = (folder / "modeling_looplm.py").read_text()
    assert "megatron" not in source.replace("megatron_loop", "") and "import megatron" not in source
    assert "from megatron_loop" not in source
    index = json.loads((folder / "model.safetensors.index.json").read_text())  # --max-shard-size 200KB
    assert len(set(index["weight_map"].values())) > 1
    names = set(index["weight_map"])
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.prelude.0.self_attn.q_proj.weight", "model.core.1.mlp.gate_proj.weight",
            "model.core.0.post_attention_layernorm.weight", "model.core.0.attn_adaln.weight",
            "model.core.1.mlp_adaln.weight", "model.initial_injection.delta_a", "model.initial_injection.b",
            "model.history_injection.beta"} <= names
    assert not any("linear_qkv" in n or "linear_fc1" in n for n in names)
    assert (folder / "tokenizer.json").is_file() and (folder / "generation_config.json").is_file()
    tied = assets.exports["core_qwen_scalar_lg"]
    from safetensors import safe_open
    with safe_open(str(tied / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and {"model.loop_gating.q", "model.initial_injection.alpha",
                                             "model.core.0.self_attn.q_norm.weight"} <= keys


def test_gqa_qkv_is_deinterleaved(assets, training_models):
    """q/k/v rows come from megatron-core's grouped [q heads..., k, v] layout, per query group."""
    from safetensors import safe_open

    model = training_models["base_llama"]
    fused = model.state_dict()["core.0.self_attention.linear_qkv.weight"]
    heads, groups, hd = 4, 2, 16
    per_group = fused.view(groups, (heads // groups + 2) * hd, -1)
    with safe_open(str(assets.exports["base_llama"] / "model.safetensors"), "pt") as f:
        q, k, v = (f.get_tensor(f"model.core.0.self_attn.{p}_proj.weight") for p in "qkv")
        gate, up = (f.get_tensor(f"model.core.0.mlp.{p}_proj.weight") for p in ("gate", "up"))
    q_rows = (heads // groups) * hd
    torch.testing.assert_close(q, per_group[:, :q_rows].reshape(heads * hd, -1), rtol=0, atol=0)
    torch.testing.assert_close(k, per_group[:, q_rows:q_rows + hd].reshape(groups * hd, -1), rtol=0, atol=0)
    torch.testing.assert_close(v, per_group[:, q_rows + hd:].reshape(groups * hd, -1), rtol=0, atol=0)
    fc1 = model.state_dict()["core.0.mlp.linear_fc1.weight"]
    torch.testing.assert_close(torch.cat([gate, up]), fc1, rtol=0, atol=0)


def test_load_looplm_from_hf_round_trips(assets, training_models):
    from megatron_loop.export.load import load_looplm_from_hf

    ids = _input_ids()
    for name in ("core_llama_rc_adaln_z3", "nonloop_qwen"):
        back = load_looplm_from_hf(assets.exports[name])
        ref = training_models[name]
        assert back.config.layout == ref.config.layout
        with torch.no_grad():
            for r in eval_loops(name):
                assert _relative_error(back(ids, num_loops=r).logits, ref(ids, num_loops=r).logits) < TOLERANCE


def test_cli_errors_are_one_line(assets, tmp_path):
    tool = str(REPO / "tools" / "convert_to_hf.py")
    missing = subprocess.run([sys.executable, tool, "--checkpoint", str(tmp_path / "nope"), "--output",
                              str(tmp_path / "out")], capture_output=True, text=True, env=offline_env())
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and missing.stderr.startswith("error: ")
    assert "nope" in missing.stderr and "checkpoint" in missing.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    refused = subprocess.run([sys.executable, tool, "--checkpoint", str(assets.checkpoints["base_llama"]),
                              "--output", str(busy)], capture_output=True, text=True, env=offline_env())
    assert refused.returncode == 2 and "--overwrite" in refused.stderr and "busy" in refused.stderr
    assert (busy / "keep.txt").read_text() == "x"


def test_overwrite_replaces_folder_atomically(assets, tmp_path):
    from megatron_loop.errors import LoopDataError
    from megatron_loop.export.convert import convert_checkpoint
    from megatron_loop.export.output_folder import write_export_record

    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(LoopDataError, match="not empty"):
        convert_checkpoint(assets.checkpoints["nonloop_llama"], out)
    with pytest.raises(LoopDataError, match="not an export written by convert_to_hf.py"):
        convert_checkpoint(assets.checkpoints["nonloop_llama"], out, overwrite=True)  # never a folder of others
    write_export_record(out)  # as an earlier export left it: --overwrite replaces it
    convert_checkpoint(assets.checkpoints["nonloop_llama"], out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    with pytest.raises(LoopDataError, match="tag folder"):
        convert_checkpoint(assets.checkpoints["nonloop_llama"], tmp_path / "x", tag="step_99")


def test_export_refuses_a_checkpoint_carrying_code(tmp_path):
    """Security: the converter reads DeepSpeed shards with weights_only=True."""
    import shutil

    import torch

    from megatron_loop.errors import LoopDataError
    from megatron_loop.export.convert import convert_checkpoint

    ckpt = tmp_path / "ckpt"
    shutil.copytree(hf_assets().checkpoints["base_llama"], ckpt)
    tag = (ckpt / "latest").read_text().strip()
    marker = tmp_path / "pwned"
    torch.save({"module": CodePayload(str(marker))}, ckpt / tag / "mp_rank_00_model_states.pt")
    with pytest.raises(LoopDataError, match="cannot read DeepSpeed checkpoint.*UnpicklingError"):
        convert_checkpoint(ckpt, tmp_path / "hf")
    assert not marker.exists()
    assert not (tmp_path / "hf").exists()


def test_loop_gating_reference_injected_exports_with_matching_logits(tmp_path):
    """The ablation switch reaches the export (config.json field, HF forward); an export written
    before the field existed loads with the original reading."""
    from transformers import AutoModelForCausalLM

    from megatron_loop import build_model
    from megatron_loop.config import build_model_config
    from megatron_loop.export.convert import export_state_dict
    from megatron_loop.export.load import load_looplm_from_hf

    cfg = build_model_config(dict(backbone="tiny-qwen", vocab_size=640, core_layers=2, train_loops=2,
                                  initial_injection="channel", history_injection="scalar", history_window=1,
                                  timestep="loop_gating", loop_gating_reference="injected",
                                  recompute="none"))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in (model.initial_injection.b, model.history_injection.beta, model.loop_gating.q):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    folder = export_state_dict(model.state_dict(), cfg, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["loop_gating_reference"] == "injected"
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = _input_ids()
    state_reading = build_model(build_model_config({**cfg.__dict__, "loop_gating_reference": "state"})).eval()
    state_reading.load_state_dict(model.state_dict())
    with torch.no_grad():
        for r in (1, 2, 4):
            want = model(ids, num_loops=r).logits
            assert _relative_error(hf(ids, num_loops=r).logits, want) < TOLERANCE, r
            if r > 1:  # the two readings differ, so the match above is not vacuous
                assert _relative_error(state_reading(ids, num_loops=r).logits, want) > 1e-3
    config = json.loads((folder / "config.json").read_text())
    del config["loop_gating_reference"]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_looplm_from_hf(folder).config.loop_gating_reference == "state"
