"""LoopFormer (Jeddi et al., ICLR 2026) as a configuration of this stack: its shortcut modulation on
(t, dt) against an independent float64 re-implementation of armenjeddi/loopformer's
``models/loopformer.py``, its trajectory sampler against an exact enumeration of ``utils.py``'s
``sample_short_trajectory``, the shortcut-consistency loss against a hand computation (gradcheck in
float64), the objective inside ``LoopLM.forward``, parameter counts, one-pass readouts and config checks."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch.func import functional_call

from megatron_loop import build_model
from megatron_loop.config import build_model_config, config_from_dict
from megatron_loop.errors import LoopConfigError
from megatron_loop.hf import modeling_looplm as export
from megatron_loop.model.shortcut import (ShortcutTrajectory, sample_short_trajectory, shortcut_consistency_loss,
                                          shortcut_trajectory)
from megatron_loop.plan import count_parameters

K = 4


def make(**kw):
    fields = dict(backbone="tiny-qwen", core_layers=2, train_loops=K, timestep="shortcut",
                  recompute="none")
    fields.update(kw)
    torch.manual_seed(0)
    return build_model(build_model_config(fields))


# ------------------------------------------------------------------ an independent LoopFormer (numpy, float64)


def _np(p: torch.Tensor) -> np.ndarray:
    return p.detach().double().numpy()


def _silu(x):
    return x / (1 + np.exp(-x))


def reference_condition(embedding, t: float, dt: float) -> np.ndarray:
    """SiLU(te(t) + dte(dt)) as models/loopformer.py: TimestepEmbedder = Linear(256, d) -> SiLU -> Linear(d, d)
    on [cos(x f); sin(x f)], f_j = exp(-ln(10000) j / 128); the SiLU is adaLN_modulation's first layer."""
    freqs = np.exp(-np.log(10000.0) * np.arange(128) / 128)

    def embed(mlp, x):
        args = x * freqs
        z = np.concatenate([np.cos(args), np.sin(args)])
        return _np(mlp[2].weight) @ _silu(_np(mlp[0].weight) @ z + _np(mlp[0].bias)) + _np(mlp[2].bias)

    return _silu(embed(embedding.time_embedder, t) + embed(embedding.step_embedder, dt))


def loopformer_modulation(block, c: np.ndarray) -> list[np.ndarray]:
    """LoopFormer's one Linear(d, 4d) per block, chunked as gate_msa, gate_mlp, scale_msa, scale_mlp,
    assembled from the two per-branch modules."""
    a, m = block.attn_adaln, block.mlp_adaln
    d = a.d
    weight = np.concatenate([_np(a.weight)[:d], _np(m.weight)[:d], _np(a.weight)[d:], _np(m.weight)[d:]])
    bias = np.concatenate([_np(a.bias)[:d], _np(m.bias)[:d], _np(a.bias)[d:], _np(m.bias)[d:]])
    return np.split(weight @ c + bias, 4)


def perturb(model, scale=0.2):
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaln" in name or "shortcut" in name:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def test_export_forward_equals_an_independent_loopformer_at_any_budget():
    """The HF model in float64 against the reference loop: x = x + g_msa attn(norm1(x)(1 + s_msa)), then the
    MLP branch, per block, with c_l on the uniform schedule of the budget r (t_l = l / r, dt = 1 / r)."""
    config = export.LoopLMConfig(core_layers=2, train_loops=K, timestep="shortcut", vocab_size=64, hidden_size=32,
                                 intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(1)
    hf = export.LoopLMForCausalLM(config).double().eval()
    perturb(hf)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    inner = hf.model
    rope = inner.rotary_emb(torch.arange(7)[None].expand(2, 7), torch.float64)
    for r in (1, 3, K, 6):
        h = inner.embed_tokens(ids)
        for step in range(r):
            c = reference_condition(inner.shortcut_embedding, step / r, 1 / r)
            for block in inner.core:
                g_msa, g_mlp, s_msa, s_mlp = (torch.from_numpy(v) for v in loopformer_modulation(block, c))
                h = h + g_msa * block.self_attn(block.input_layernorm(h) * (1 + s_msa), rope, None, None, 0)
                h = h + g_mlp * block.mlp(block.post_attention_layernorm(h) * (1 + s_mlp))
        want = hf.lm_head(inner.norm(h))
        with torch.no_grad():
            got = hf(ids, num_loops=r).logits
        # 1e-6: the sinusoids are fp32 (LoopFormer's ``t[:, None].float() * freqs``), the reference's float64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=f"r={r}")
    assert not torch.allclose(hf(ids, num_loops=3).logits, hf(ids, num_loops=3, timestep_grid="prefix").logits)


def test_training_model_runs_a_trajectory_of_step_sizes():
    """``loop_steps`` (n_l / K): c_l at t_l = sum of the earlier steps, dt_l = n_l / K; the full trajectory is the
    training grid and a uniform one the rescaled grid of its length, bit for bit."""
    model = make().eval()
    perturb(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        steps = (1, 3)
        rope = model._rope(9, ids.device)
        h = model.embed_tokens(ids).transpose(0, 1)
        for t, dt in ((0.0, 0.25), (0.25, 0.75)):
            c = torch.from_numpy(reference_condition(model.shortcut_embedding, t, dt)).float()
            for block in model.core:
                h = block(h, rope, c)
        want = torch.nn.functional.linear(model.norm(h).transpose(0, 1), model.head_weight())
        torch.testing.assert_close(model(ids, loop_steps=steps).logits, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(model(ids, loop_steps=(1,) * K).logits, model(ids).logits)
        assert torch.equal(model(ids, loop_steps=(2, 2)).logits, model(ids, num_loops=2).logits)
        assert not torch.allclose(model(ids, loop_steps=(1, 3)).logits, model(ids, loop_steps=(3, 1)).logits)
    for bad in ((1, 2), (0, 4), (5, -1)):
        with pytest.raises(LoopConfigError, match=r"expected positive integers summing to 4"):
            model(ids, loop_steps=bad)


def test_modulation_gradients_numerically():
    """c_l -> [g; s] = W c_l + b -> u + g Branch((1 + s) Norm(u)), float64, every parameter and the input."""
    torch.manual_seed(4)
    d = 4
    embedding = export.ShortcutEmbedding(d, frequencies=8).double()
    adaln = export.AdaLN(d, **export.adaln_arguments("shortcut", d)).double()
    with torch.no_grad():
        adaln.weight.normal_(0, 0.5)
        adaln.bias.normal_(0, 0.5)
    branch = torch.nn.Linear(d, d).double()

    def norm(x):  # float64 throughout (the export's RMSNorm computes in fp32)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    t, dt = torch.tensor([0.0, 0.5], dtype=torch.float64), torch.tensor([0.5, 0.5], dtype=torch.float64)
    e_names = [n for n, _ in embedding.named_parameters()]
    a_names = [n for n, _ in adaln.named_parameters()]

    def f(u, *values):
        e, a = dict(zip(e_names, values)), dict(zip(a_names, values[len(e_names):]))
        total = 0
        for c in functional_call(embedding, e, (t, dt)):
            u = export.modulated_residual(u, norm, branch, lambda x: functional_call(adaln, a, (x,)), c)
            total = total + u.sum()
        return total

    u = torch.randn(3, d, dtype=torch.float64, requires_grad=True)
    values = [p.detach().clone().requires_grad_(True) for p in (*embedding.parameters(), *adaln.parameters())]
    assert torch.autograd.gradcheck(lambda u, *v: f(u, *v), (u, *values))


# ------------------------------------------------------------------ the trajectory sampler


def loopformer_distribution(max_loops: int) -> dict[tuple[int, ...], Fraction]:
    """Exact probabilities of utils.sample_short_trajectory's outputs (in units of 1/K), enumerated by
    following its float arithmetic: L ~ randint(1, K-1), then random.choice of the allowed steps <= cap."""
    allowed = [x / max_loops for x in range(1, max_loops + 1)]
    out: dict[tuple[int, ...], Fraction] = {}

    def walk(prefix, remaining, remaining_steps, left, p):
        if left == 0:
            key = tuple(round(v * max_loops) for v in (*prefix, remaining))
            out[key] = out.get(key, 0) + p
            return
        cap = remaining - (remaining_steps - 1) * allowed[0]
        choices = [s for s in allowed if s <= cap + 1e-12]
        for v in choices:
            walk((*prefix, v), remaining - v, remaining_steps - 1, left - 1, p / len(choices))

    for length in range(1, max_loops):
        walk((), 1.0, length, length - 1, Fraction(1, max_loops - 1))
    return out


def test_sampler_draws_loopformers_distribution():
    exact = loopformer_distribution(K)
    assert sum(exact.values()) == 1 and len(exact) == 1 + 3 + 3  # (4); (1,3), (2,2), (3,1); (1,1,2), (1,2,1), (2,1,1)
    n = 3000
    counts = Counter(sample_short_trajectory(K, 42, step) for step in range(n))
    assert set(counts) <= set(exact)
    for key, p in exact.items():
        sd = (float(p) * (1 - float(p)) / n) ** 0.5
        assert abs(counts[key] / n - float(p)) < 4 * sd, (key, counts[key] / n, float(p))
    for steps in counts:  # positive units summing to K, 1..K-1 steps
        assert min(steps) >= 1 and sum(steps) == K and 1 <= len(steps) <= K - 1
    # the reference itself, run with Python's random, agrees with the enumeration (the reading is LoopFormer's)
    random.seed(0)
    ref = Counter()
    for _ in range(n):
        length = random.randint(1, K - 1)
        remaining, traj = 1.0, []
        for left in range(length, 1, -1):
            v = random.choice([x / K for x in range(1, K + 1) if x / K <= remaining - (left - 1) / K + 1e-12])
            traj.append(v)
            remaining -= v
        ref[tuple(round(v * K) for v in (*traj, remaining))] += 1
    assert set(ref) == set(exact)


def test_sampler_is_stateless_and_seeded():
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state()
    first = [sample_short_trajectory(8, 7, s) for s in range(50)]
    assert first == [sample_short_trajectory(8, 7, s) for s in range(50)]  # a resume redraws the same
    assert first != [sample_short_trajectory(8, 8, s) for s in range(50)]  # the seed matters
    assert len(set(first)) > 10 and max(len(t) for t in first) <= 7
    # LoopFormer draws per micro-batch (train.py's gradient-accumulation loop)
    assert [sample_short_trajectory(8, 7, s, micro=1) for s in range(50)] != first
    assert (np.random.get_state()[1] == np_state).all() and torch.equal(torch.get_rng_state(), torch_state)
    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 8, "timestep": "shortcut"},
                            "train": {"seed": 7, "shortcut_consistency": True, "shortcut_consistency_weight": 0.5}})
    spec = shortcut_trajectory(cfg.train, 8, 3)
    assert spec == ShortcutTrajectory(first[3], 0.1, 0.5)
    off = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 8}})
    assert shortcut_trajectory(off.train, 8, 3) is None


# ------------------------------------------------------------------ the shortcut-consistency loss


def test_consistency_loss_by_hand_and_its_gradient():
    full = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    short = torch.tensor([[0.0, -1.0], [2.5, 3.0]], requires_grad=True)
    loss = shortcut_consistency_loss(full, short)
    assert loss.item() == pytest.approx((1 + 1 + 4 + 0) / 4)
    loss.backward()
    assert full.grad is None  # stop-gradient on the full trajectory
    torch.testing.assert_close(short.grad, 2 * (short - full).detach() / 4)
    halved = torch.tensor([[0.0, -1.0], [2.5, 3.0]], requires_grad=True)
    tp_loss = shortcut_consistency_loss(full, halved, tp_size=2)  # head_input's backward sums 2 ranks
    assert tp_loss.item() == loss.item()
    tp_loss.backward()
    torch.testing.assert_close(halved.grad, short.grad / 2)
    a = torch.randn(2, 3, 4, dtype=torch.float64)
    b = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: shortcut_consistency_loss(a, x), (b,))


def test_objective_is_full_plus_weighted_short_and_consistency():
    model = make(recompute="per_loop").train()
    perturb(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(6))
    spec = ShortcutTrajectory((1, 3), short_loss_weight=0.3, consistency_weight=0.7)
    loss = model(ids, labels=ids, compute_logits=False, objective=spec).loss
    full = model(ids, labels=ids, compute_logits=False, return_hidden=True)
    short = model(ids, labels=ids, compute_logits=False, return_hidden=True, loop_steps=(1, 3))
    mse = ((short.hidden - full.hidden) ** 2).mean()
    torch.testing.assert_close(loss, full.loss + 0.3 * short.loss + 0.7 * mse, rtol=1e-6, atol=0)
    assert abs(full.loss.item() - short.loss.item()) > 1e-4 and mse.item() > 0  # each term matters
    model.zero_grad()
    loss.backward()
    # every conditioning parameter trains (the time embedders through every loop of both trajectories)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if "shortcut" in n or "adaln" in n)
    with pytest.raises(LoopConfigError, match="needs labels"):
        model(ids, objective=spec)


def test_composes_with_psi_conditioning():
    """The trajectory's (t_l, dt_l) feed psi of Eq. (timestep_features) for LG / BG / AdaLN."""
    model = make(timestep="adaln").eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        for block in model.core:
            block.attn_adaln.weight.normal_(0, 0.3)
        assert torch.equal(model(ids, loop_steps=(2, 2)).logits, model(ids, num_loops=2).logits)
        assert not torch.allclose(model(ids, loop_steps=(1, 3)).logits, model(ids, loop_steps=(3, 1)).logits)
    assert model.timestep_inputs(2, "rescaled", torch.device("cpu"), (1, 3)).shape == (2, 8)


# ------------------------------------------------------------------ counts, readouts, config


@pytest.mark.parametrize("fields", [dict(backbone="tiny-qwen", core_layers=2, train_loops=4),
                                    dict(backbone="qwen3-0.6b", core_layers=3, train_loops=4)])
def test_dry_run_parameter_count_equals_the_model(fields):
    cfg = build_model_config(dict(fields, timestep="shortcut"))
    model = build_model(cfg, device="meta")
    count = count_parameters(cfg)
    d, s = cfg.hidden_size, cfg.core_layers
    extra = s * 2 * (2 * d * d + 2 * d) + 2 * (256 * d + d + d * d + d)
    assert count.total == model.num_parameters() and count.total - count.backbone == extra
    assert model.num_parameters(backbone_only=True) == count.backbone
    assert all(p.looplm_role == "conditioning" for n, p in model.named_parameters() if "shortcut" in n or "adaln" in n)


def test_one_pass_readouts_fall_back_on_the_rescaled_grid_only():
    from megatron_loop.eval.one_pass import sweep_passes

    config = export.LoopLMConfig(core_layers=1, train_loops=K, timestep="shortcut", vocab_size=64, hidden_size=32,
                                 intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(9)
    hf = export.LoopLMForCausalLM(config).eval()
    perturb(hf)
    passes = sweep_passes(hf, [1, 2, 4])
    assert not passes.one_pass and "timestep conditioning (shortcut) on the rescaled grid" in passes.reason
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():  # prefix grid: the first r steps of the full trajectory, one pass for every r <= K
        read = hf.loop_readouts(ids, [1, 2, 4], timestep_grid="prefix")
        for r in (1, 2, 4):
            assert torch.equal(read[r], hf(ids, num_loops=r, timestep_grid="prefix", use_cache=False).logits)


@pytest.mark.parametrize("train,match", [
    ({"shortcut_consistency": True, "loop_sampling": "uniform"}, "expected 'fixed' and null"),
    ({"shortcut_consistency": True, "backprop_loops": 2}, "expected 'fixed' and null"),
    ({"shortcut_short_loss_weight": 0.5}, "unless train.shortcut_consistency is true"),
    ({"shortcut_consistency": True, "shortcut_consistency_weight": -1.0}, "a finite number >= 0"),
])
def test_config_refusals_are_one_line(train, match):
    with pytest.raises(LoopConfigError, match=match) as err:
        config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 4, "timestep": "shortcut",
                                    "initial_injection": "scalar"}, "train": train})
    assert "\n" not in str(err.value)
    with pytest.raises(LoopConfigError, match="expected train_loops >= 2"):
        config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": 1},
                          "train": {"shortcut_consistency": True}})


def test_loop_dynamics_reads_the_shortcut_gates():
    """training/dynamics.py: the mean gate g of each branch at c_l of the training grid, from the modules."""
    from megatron_loop.training.dynamics import gate_values

    model = make()
    perturb(model)
    with torch.no_grad():
        c = model.timestep_inputs(K, model.config.timestep_grid, torch.device("cpu"))
        values = gate_values(model, c)
        for l in range(1, K + 1):
            for b in ("attn", "mlp"):
                want = sum(getattr(blk, f"{b}_adaln")(c[l - 1])[0].mean().item() for blk in model.core) / 2
                assert values[f"adaln_scale_{b}_l{l}"] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert len(values) == 2 * K


def test_direct_conditions_equal_the_module_path():
    """The loop dynamics read c_l from the weights (no module call under ZeRO-3): the same numbers."""
    from megatron_loop.model.shortcut import timestep_inputs

    model = make()
    with torch.no_grad():
        for grid in ("rescaled", "prefix"):
            want = timestep_inputs(model, 3, grid, torch.device("cpu"))
            assert torch.equal(timestep_inputs(model, 3, grid, torch.device("cpu"), direct=True), want)
