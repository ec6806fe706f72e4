"""LoopLM architecture: parameter counts, causality, weight tying, r != K, overfitting, config errors
(the loss: test_model_loss.py; activation checkpointing: test_perf_checkpointing.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_loop import LoopConfigError, build_model, load_config
from megatron_loop.config import build_model_config, config_from_dict

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)

ROOT = Path(__file__).resolve().parents[1]


def tiny(**kw):
    base = dict(backbone="tiny-llama", core_layers=2, train_loops=3, activation_checkpointing="none")
    base.update(kw)
    return build_model_config(base)


# ---------------------------------------------------------------- parameter counts (App. C.1)
PAPER_COUNTS = [
    # (backbone, p, s, K, c, parameters) -- Tables 1 and 2
    ("llama3.1-1b", 0, 20, 1, 0, 1_007_482_368),
    ("qwen3-0.6b", 0, 28, 1, 0, 596_049_920),
    ("llama3.1-1b", 0, 2, 10, 0, 455_351_808),
    ("llama3.1-1b", 0, 1, 19, 1, 455_351_808),
    ("llama3.1-1b", 0, 4, 5, 0, 516_699_648),
    ("llama3.1-1b", 1, 2, 9, 1, 516_699_648),
    ("llama3.1-1b", 0, 5, 4, 0, 547_373_568),
    ("llama3.1-1b", 2, 3, 6, 0, 547_373_568),
    ("llama3.1-1b", 0, 10, 2, 0, 700_743_168),
    ("llama3.1-1b", 3, 5, 3, 2, 700_743_168),
    ("qwen3-0.6b", 0, 4, 7, 0, 218_507_264),
    ("qwen3-0.6b", 2, 2, 13, 0, 218_507_264),
]


@pytest.mark.parametrize("backbone,p,s,k,c,expected", PAPER_COUNTS)
def test_parameter_counts_equal_paper(backbone, p, s, k, c, expected):
    cfg = build_model_config(dict(backbone=backbone, prelude_layers=p, core_layers=s, train_loops=k, coda_layers=c))
    model = build_model(cfg, device="meta")
    assert model.num_parameters() == expected
    # independent of K: the same physical layers at another loop count
    other = build_model(build_model_config(dict(backbone=backbone, prelude_layers=p, core_layers=s,
                                                train_loops=k + 3, coda_layers=c)), device="meta")
    assert other.num_parameters() == expected


def test_qwen_initial_injection_baseloop_counts():
    # App. C.1 "Initial-state injection models": Qwen BaseLoop counts ~187.05M, 218.51M, 265.70M, 375.82M
    got = [build_model(build_model_config(dict(backbone="qwen3-0.6b", core_layers=s, train_loops=28 // s)),
                       device="meta").num_parameters() for s in (2, 4, 7, 14)]
    assert [round(n / 1e6, 2) for n in got] == [187.05, 218.51, 265.70, 375.82]


def test_backbone_presets_are_exact():
    llama = build_model_config(dict(backbone="llama3.1-1b"))
    assert (llama.hidden_size, llama.intermediate_size, llama.num_attention_heads, llama.num_key_value_heads,
            llama.head_dim, llama.vocab_size, llama.rms_norm_eps, llama.rope_theta, llama.tie_word_embeddings,
            llama.qk_norm) == (1536, 5376, 12, 3, 128, 128256, 1e-5, 5e5, False, False)
    assert llama.rope_scaling["rope_type"] == "llama3"
    assert llama.rope_scaling["original_max_position_embeddings"] == 8192
    qwen = build_model_config(dict(backbone="qwen3-0.6b"))
    assert (qwen.hidden_size, qwen.intermediate_size, qwen.num_attention_heads, qwen.num_key_value_heads,
            qwen.head_dim, qwen.vocab_size, qwen.rms_norm_eps, qwen.rope_theta, qwen.tie_word_embeddings,
            qwen.qk_norm, qwen.rope_scaling) == (1024, 3072, 16, 8, 128, 151936, 1e-6, 1e6, True, True, None)
    # every field overridable
    assert build_model_config(dict(backbone="qwen3-0.6b", hidden_size=512)).hidden_size == 512


def test_initialisation_is_normal_002():
    torch.manual_seed(0)
    model = build_model(build_model_config(dict(backbone="tiny-llama", hidden_size=128, intermediate_size=256,
                                                vocab_size=4096, core_layers=2)))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert abs(p.std().item() - 0.02) < 0.002, name
            assert abs(p.mean().item()) < 0.002, name
        else:
            assert torch.all(p == 1), name  # RMSNorm weights


# ---------------------------------------------------------------- semantics
def test_causality():
    torch.manual_seed(0)
    model = build_model(tiny(prelude_layers=1, coda_layers=1, qk_norm=True)).eval()
    x = torch.randint(0, 2048, (2, 24))
    y = x.clone()
    y[:, 15:] = torch.randint(0, 2048, (2, 9))
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-6)
    assert not torch.allclose(a[:, 15:], b[:, 15:], atol=1e-3)


def _unrolled_copy(model, r):
    """A NonLoop model with the shared core written out r times (duplicated, untied weights)."""
    cfg = model.config
    unrolled = build_model(tiny(prelude_layers=cfg.prelude_layers, coda_layers=cfg.coda_layers,
                                core_layers=cfg.core_layers * r, train_loops=1))
    state = {}
    s = cfg.core_layers
    for key, value in model.state_dict().items():
        if key.startswith("core."):
            _, idx, rest = key.split(".", 2)
            for loop in range(r):
                state[f"core.{loop * s + int(idx)}.{rest}"] = value
        else:
            state[key] = value
    unrolled.load_state_dict(state)
    return unrolled


def test_weight_tying_gradient_is_sum_over_unrolled_copies():
    torch.manual_seed(0)
    model = build_model(tiny(prelude_layers=1, coda_layers=1))
    unrolled = _unrolled_copy(model, 3)
    x = torch.randint(0, 2048, (2, 12))
    out, ref = model(x), unrolled(x)
    assert torch.allclose(out.logits, ref.logits, atol=1e-6)
    out.logits.square().mean().backward()
    ref.logits.square().mean().backward()
    ref_params = dict(unrolled.named_parameters())
    for name, p in model.core.named_parameters():
        idx, rest = name.split(".", 1)
        per_copy = [ref_params[f"core.{loop * 2 + int(idx)}.{rest}"].grad for loop in range(3)]
        assert all(g.abs().sum() > 0 for g in per_copy), name
        assert torch.allclose(p.grad, sum(per_copy), rtol=1e-5, atol=1e-9), name
    for name, p in model.named_parameters():
        if not name.startswith("core."):
            assert torch.allclose(p.grad, ref_params[name].grad, rtol=1e-5, atol=1e-9), name


def test_inference_loop_count_differs_from_training():
    torch.manual_seed(0)
    model = build_model(tiny()).eval()
    x = torch.randint(0, 2048, (1, 10))
    with torch.no_grad():
        outs = {r: model(x, num_loops=r, return_trajectory=True) for r in (1, 3, 7)}
    for r, out in outs.items():
        assert out.logits.shape == (1, 10, 2048)
        assert len(out.trajectory) == r + 1
    assert torch.equal(outs[3].logits, model(x).logits)  # default is K
    assert not torch.allclose(outs[1].logits, outs[7].logits)
    # trajectory prefixes agree across r (the same recurrence)
    assert torch.allclose(outs[7].trajectory[3], outs[3].trajectory[3])
    with pytest.raises(LoopConfigError, match="num_loops=0"):
        model(x, num_loops=0)


def test_tiny_model_overfits_a_small_batch():
    torch.manual_seed(0)
    model = build_model(tiny(vocab_size=256))
    x = torch.randint(0, 256, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss = model(x, labels=x).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 5.0 and loss.item() < 0.5 * first


# ---------------------------------------------------------------- config
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


@pytest.mark.parametrize("config,expected", [
    ("examples/llama_4x5.yaml", dict(params=516_699_648, physical_depth=4, effective_depth=20, train_steps=5394,
                                     warmup_steps=270, stable_steps=4585, decay_steps=539, global_batch=1824,
                                     accumulation=6, data_parallel_size=8)),  # 38 x 6 x 8 = 1824
    ("examples/qwen_4x7.yaml", dict(params=218_507_264, physical_depth=4, effective_depth=28, train_steps=2860,
                                    warmup_steps=143, stable_steps=2431, decay_steps=286, global_batch=2048,
                                    accumulation=8, data_parallel_size=8)),  # 32 x 8 x 8 = 2048
])
def test_dry_run_cli(config, expected):
    from data_fixtures import data_assets

    prefix = data_assets().prefix  # the dry run checks that the data exists; the paper's is not here
    out = subprocess.run([sys.executable, "pretrain_loop.py", "--config", config, "--dry-run",
                          "--set", f"data.train_prefixes=[{prefix}]", "--set", f"data.valid_prefixes=[{prefix}_valid]",
                          "--data-parallel-size", "8"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    report = json.loads(lines[0])
    for key in ("params", "params_backbone", "physical_depth", "effective_depth", "train_tokens", "train_steps",
                "warmup_steps", "stable_steps", "decay_steps", "global_batch", "seq_length"):
        assert key in report
    for k, v in expected.items():
        assert report[k] == v, k


def test_default_token_budget_is_twenty_tokens_per_nonloop_parameter():
    from megatron_loop.plan import training_plan

    cfg = config_from_dict({"model": {"backbone": "llama3.1-1b", "core_layers": 4, "train_loops": 5},
                            "train": {"global_batch_size": 1824, "micro_batch_size": 38, "seq_length": 2048}})
    plan = training_plan(cfg)
    assert plan["train_tokens"] == 20 * 1_007_482_368
    assert plan["train_steps"] == 5394


@pytest.mark.parametrize("model,train,message", [
    ({"core_layers": 2, "bogus": 1}, {}, "model.bogus: unknown key"),
    ({"prelude_layers": -1}, {}, "model.prelude_layers=-1: expected an integer >= 0"),
    ({"coda_layers": -2}, {}, "model.coda_layers=-2: expected an integer >= 0"),
    ({"train_loops": 0}, {}, "model.train_loops=0: expected an integer >= 1"),
    ({"num_attention_heads": 6, "num_key_value_heads": 4}, {}, "model.num_attention_heads=6: expected a multiple of num_key_value_heads=4"),
    ({"backbone": "gpt5"}, {}, "model.backbone='gpt5': unknown backbone"),
    ({"backbone": "tiny-llama"}, {"seq_length": 8192}, "train.seq_length=8192: expected at most the model's maximum context"),
    ({"core_layers": "four"}, {}, "model.core_layers='four': expected an integer"),
    ({"timestep": "fourier"}, {}, "model.timestep='fourier': expected one of"),
    ({}, {"global_batch_size": 10, "micro_batch_size": 4}, "train.global_batch_size=10: expected a multiple of micro_batch_size=4"),
])
def test_bad_config_errors(model, train, message):
    with pytest.raises(LoopConfigError) as err:
        config_from_dict({"model": model, "train": train}, source="bad.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("bad.yaml: ")


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


def test_default_validation_loops():
    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4}})
    assert cfg.train.eval_loops == [2, 4, 8]  # K/2, K, 2K
    prefix = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4, "timestep": "adaln",
                                         "timestep_grid": "prefix"}})
    assert prefix.train.eval_loops == [2, 4]
