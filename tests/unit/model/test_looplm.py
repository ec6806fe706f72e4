"""``model/looplm.py``, the LoopLM architecture: parameter counts, initialisation, causality, weight tying,
r != K, overfitting (the loss: test_loss.py; activation recomputation: test_recompute.py; truncated
backpropagation: test_looplm_truncation.py; the config's errors: tests/unit/config/)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop import LoopConfigError, build_model
from megatron_loop.config import build_model_config

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


def tiny(**kw):
    base = dict(backbone="tiny-llama", core_layers=2, train_loops=3, recompute="none")
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


# ---------------------------------------------------------------- built plain
_PLAIN_BUILD = """
import json, warnings
import torch
import torch.distributed as dist
from megatron_loop.config import load_config
from megatron_loop.model import build_model
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state
model = build_model(load_config("examples/tiny_2x3.yaml").model)
tokens = torch.randint(0, model.config.vocab_size, (2, 16))
loss = model(tokens, labels=tokens).loss
loss.backward()
print("RESULT " + json.dumps({"dist": dist.is_initialized(), "megatron": parallel_state.model_parallel_is_initialized(),
                              "loss": bool(torch.isfinite(loss))}))
"""


def test_building_a_model_in_a_fresh_process_creates_no_process_group():
    """build_model creates no process group and touches no global parallel state: torch.distributed and
    megatron-core's parallel state stay uninitialised through the build, a forward and a backward (export,
    probes and checkpoint reading build models this way; training owns its groups and passes the placement)."""
    import json
    import os
    import subprocess
    import sys

    from testpaths import REPO

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", _PLAIN_BUILD], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULT "):]) == {"dist": False, "megatron": False, "loss": True}
