"""Recurrence conditioning (model/conditioning.py): identity at init, exact formulas against an
independent reference loop, timestep grids, parameter counts, gradient flow."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_loop import LoopConfigError, build_model
from megatron_loop.config import build_model_config
from megatron_loop.model.compat import rope_freqs
from megatron_loop.model.conditioning import timestep_features
from megatron_loop.parallel.bootstrap import ensure_groups

K = 3
D = 64

@pytest.fixture(autouse=True, scope="module")
def megatron_groups():
    """megatron-core's own attention (the reference path, or blocks called with rotary angles) reads its
    process groups when it runs; the model is built without any (build_model creates none)."""
    ensure_groups()



def make(**kw):
    base = dict(backbone="tiny-qwen", core_layers=2, train_loops=K, recompute="none")
    base.update(kw)
    torch.manual_seed(0)
    return build_model(build_model_config(base)).eval()


def randomise_conditioning(model, std=0.3):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.looplm_role == "conditioning":
                p.add_(torch.randn(p.shape, generator=gen) * std / max(1, p.shape[-1] ** 0.5 if p.dim() > 1 else 1))


# ------------------------------------------------------------------ independent reference
def psi_ref(l: int, T: int) -> torch.Tensor:
    t, dt = l / T, 1 / T
    return torch.tensor([t, dt, t * t, dt * dt, t * dt, math.sin(math.pi * t), math.cos(math.pi * t) - 1,
                         math.sin(2 * math.pi * t)], dtype=torch.float32)


def ref_block(block, u, rope, psi, timestep):
    """u+ = u + g * Branch((1 + s) * Norm(u)) for attention then MLP (Eq. branch_timestep_modulation)."""
    for name, norm in (("attn", block.input_layernorm), ("mlp", block.pre_mlp_layernorm)):
        g, s = 1.0, 0.0
        if timestep == "branch_gating":
            g = 1 + psi @ getattr(block, f"{name}_gate").q
        elif timestep == "adaln":
            out = getattr(block, f"{name}_adaln").weight @ psi
            g, s = 1 + out[:D], out[D:]
        x = norm(u) * (1 + s)
        y = block.self_attention(x, None, rotary_pos_emb=rope)[0] if name == "attn" else block.mlp(x)[0]
        u = u + g * y
    return u


def ref_injection(model, h, h0):
    kind = model.config.initial_injection
    inj = model.initial_injection
    if kind == "none":
        return h
    if kind == "scalar":
        return h + inj.alpha * h0
    if kind == "channel":
        return inj.a * h + inj.b * h0
    if kind == "residual_channel":
        return (1 + inj.delta_a) * h + inj.b * h0
    W_h, W_0 = inj.weight[:, :D], inj.weight[:, D:]
    return h @ W_h.T + h0 @ W_0.T


def ref_history(model, states, l):
    """sum_{j=1}^{m_l} B_j(h_{l-j} - h_l), m_l = min(w, max(l-1, 0)); states[i] = h_i."""
    cfg = model.config
    if cfg.history_injection == "none":
        return 0
    m = min(cfg.history_window, max(l - 1, 0))
    beta = model.history_injection.beta
    total = 0
    for j in range(1, m + 1):
        diff = states[l - j] - states[l]
        total = total + (diff @ beta[j - 1].T if cfg.history_injection == "dense" else beta[j - 1] * diff)
    return total


def reference_trajectory(model, x, r, grid="rescaled"):
    cfg = model.config
    T = r if grid == "rescaled" else cfg.train_loops
    rope = rope_freqs(model.rope_inv_freq, x.shape[1], x.device)
    h = model.embed_tokens(x).transpose(0, 1)
    for blk in model.prelude:
        h = ref_block(blk, h, rope, None, "none")
    states = [h]
    for l in range(r):
        psi = psi_ref(l, T)
        hl = states[l]
        u = ref_injection(model, hl, states[0]) + ref_history(model, states, l)
        y = u
        for blk in model.core:
            y = ref_block(blk, y, rope, psi, cfg.timestep)
        if cfg.timestep == "loop_gating":  # LG mixes with h_l, or with the core input u_l
            x = u if cfg.loop_gating_reference == "injected" else hl
            y = x + (1 + psi @ model.loop_gating.q) * (y - x)
        states.append(y)
    return [s.transpose(0, 1) for s in states]


MECHANISMS = [
    dict(history_injection="scalar", history_window=1),
    dict(history_injection="scalar", history_window=2),
    dict(history_injection="channel", history_window=4),
    dict(history_injection="dense", history_window=2),
    dict(initial_injection="scalar"),
    dict(initial_injection="channel"),
    dict(initial_injection="residual_channel"),
    dict(initial_injection="dense"),
    dict(initial_injection="dense", history_injection="channel", history_window=2),
    dict(timestep="loop_gating"),
    dict(timestep="branch_gating"),
    dict(timestep="adaln"),
    dict(initial_injection="scalar", timestep="loop_gating"),
    dict(history_injection="channel", history_window=1, timestep="branch_gating"),
    dict(initial_injection="channel", history_injection="scalar", history_window=2, timestep="loop_gating"),
    dict(initial_injection="residual_channel", history_injection="dense", history_window=1, timestep="adaln",
         prelude_layers=1, coda_layers=1),
    dict(initial_injection="channel", history_injection="scalar", history_window=2, timestep="loop_gating",
         loop_gating_reference="injected"),
    dict(initial_injection="dense", timestep="loop_gating", loop_gating_reference="injected", prelude_layers=1),
]


def _id(m):
    return "+".join(f"{k}={v}" for k, v in m.items())


@pytest.mark.parametrize("mech", MECHANISMS, ids=_id)
def test_identity_at_initialisation(mech):
    x = torch.randint(0, 2048, (2, 12))
    layout = {k: mech[k] for k in ("prelude_layers", "coda_layers") if k in mech}
    plain = make(**layout)
    cond = make(**mech)
    missing, unexpected = cond.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(cond.get_parameter(k).looplm_role == "conditioning" for k in missing
                                  if not k.endswith("_extra_state"))
    with torch.no_grad():
        for r in (1, K, 2 * K):
            assert torch.allclose(cond(x, num_loops=r).logits, plain(x, num_loops=r).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mech", MECHANISMS, ids=_id)
def test_trajectory_matches_reference_formula(mech):
    model = make(**mech)
    randomise_conditioning(model)
    x = torch.randint(0, 2048, (2, 10))
    with torch.no_grad():
        for r in (K - 1, K, 2 * K):
            got = model(x, num_loops=r, return_trajectory=True).trajectory
            ref = reference_trajectory(model, x, r)
            assert len(got) == r + 1
            for l, (a, b) in enumerate(zip(got, ref)):
                assert torch.allclose(a, b, atol=2e-5, rtol=1e-5), (r, l, (a - b).abs().max())
            # the conditioning changed the trajectory (the test is not vacuous)
    plain = make(**{k: mech[k] for k in ("prelude_layers", "coda_layers") if k in mech})
    plain.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(plain(x).logits, model(x).logits, atol=1e-4)


def test_loop_gating_reference_changes_the_forward_only_with_injection():
    """``injected`` mixes with u_l: same weights, different logits once injection is non-trivial;
    identical logits when there is no injection (u_l = h_l)."""
    x = torch.randint(0, 2048, (2, 10))
    for mech, differ in [(dict(initial_injection="channel"), True), (dict(), False)]:
        state = make(timestep="loop_gating", **mech)
        randomise_conditioning(state)
        injected = make(timestep="loop_gating", loop_gating_reference="injected", **mech)
        injected.load_state_dict(state.state_dict())
        with torch.no_grad():
            a, b = state(x, num_loops=2 * K).logits, injected(x, num_loops=2 * K).logits
        assert (not torch.allclose(a, b, atol=1e-4)) == differ
    with pytest.raises(LoopConfigError, match="loop_gating_reference='injected': expected 'state' unless timestep"):
        build_model_config(dict(backbone="tiny-qwen", timestep="adaln", loop_gating_reference="injected"))


@pytest.mark.parametrize("kind,names", [("scalar", ["alpha"]), ("channel", ["a", "b"]),
                                        ("residual_channel", ["delta_a", "b"])])
def test_injection_init_noise_perturbs_the_identity(kind, names):
    """App. E.1 ablation: N(0, 0.03^2) added to each coefficient of the identity initialisation,
    in parameter order, from the global generator (so the run seed fixes it)."""
    from megatron_loop.model.conditioning import InitialStateInjection

    identity = InitialStateInjection(kind, D)
    torch.manual_seed(11)
    noisy = InitialStateInjection(kind, D, init_noise=0.03)
    torch.manual_seed(11)
    for name in names:
        want = getattr(identity, name) + torch.randn_like(getattr(identity, name)) * 0.03
        assert torch.equal(getattr(noisy, name), want), name
    deviation = torch.cat([(getattr(noisy, n) - getattr(identity, n)).flatten() for n in names])
    if deviation.numel() > 100:
        assert 0.02 < deviation.std().item() < 0.04
    # through the config: the model at initialisation is no longer BaseLoop
    x = torch.randint(0, 2048, (1, 8))
    plain, cond = make(initial_injection=kind), make(initial_injection=kind, injection_init_noise=0.03)
    with torch.no_grad():
        assert not torch.allclose(plain(x).logits, cond(x).logits, atol=1e-5)
    with pytest.raises(LoopConfigError, match="injection_init_noise=0.03: expected 0 unless initial_injection"):
        build_model_config(dict(backbone="tiny-qwen", initial_injection="dense", injection_init_noise=0.03))


def test_history_window_rule_first_transitions():
    """h1 = F(h0), h2 = F(h1), h3 = F(h2 + beta_1 (h1 - h2)) (App. C.1, history models)."""
    model = make(history_injection="scalar", history_window=2, train_loops=4)
    with torch.no_grad():
        model.history_injection.beta.copy_(torch.tensor([0.7, -0.4]))
    x = torch.randint(0, 2048, (1, 8))
    rope = rope_freqs(model.rope_inv_freq, 8, x.device)

    def F(h):
        for blk in model.core:
            h = blk(h, rope)
        return h

    with torch.no_grad():
        traj = [t.transpose(0, 1) for t in model(x, num_loops=4, return_trajectory=True).trajectory]
        h0 = model.embed_tokens(x).transpose(0, 1)
        h1 = F(h0)
        h2 = F(h1)
        h3 = F(h2 + 0.7 * (h1 - h2))
        h4 = F(h3 + 0.7 * (h2 - h3) - 0.4 * (h1 - h3))
    for got, want in zip(traj, [h0, h1, h2, h3, h4]):
        assert torch.allclose(got, want, atol=1e-5)


def test_prefix_grid_trajectory_matches_reference():
    model = make(timestep="adaln", timestep_grid="prefix")
    randomise_conditioning(model)
    x = torch.randint(0, 2048, (1, 8))
    with torch.no_grad():
        got = model(x, num_loops=2, return_trajectory=True).trajectory
        ref = reference_trajectory(model, x, 2, grid="prefix")
        rescaled = model(x, num_loops=2, timestep_grid="rescaled").logits
    assert all(torch.allclose(a, b, atol=2e-5) for a, b in zip(got, ref))
    assert not torch.allclose(rescaled, model(x, num_loops=2).logits.detach(), atol=1e-5)
    with pytest.raises(LoopConfigError, match="prefix.*num_loops=4"):
        model(x, num_loops=4)


# ------------------------------------------------------------------ timestep features
def test_psi_matches_formula_and_grids():
    psi = timestep_features(4, train_loops=7, grid="rescaled", dtype=torch.float64)
    assert psi.shape == (4, 8)
    for l in range(4):
        t, dt = l / 4, 1 / 4
        want = [t, dt, t * t, dt * dt, t * dt, math.sin(math.pi * t), math.cos(math.pi * t) - 1,
                math.sin(2 * math.pi * t)]
        assert torch.allclose(psi[l], torch.tensor(want, dtype=torch.float64), atol=1e-12)
    # rescaled: T = r -> t_l = l / r ; prefix: T = K -> t_l = l / K, first r steps
    assert torch.allclose(timestep_features(2, 4, "rescaled")[:, 0], torch.tensor([0.0, 0.5]))
    assert torch.allclose(timestep_features(2, 4, "rescaled")[:, 1], torch.tensor([0.5, 0.5]))
    assert torch.allclose(timestep_features(2, 4, "prefix")[:, 0], torch.tensor([0.0, 0.25]))
    assert torch.allclose(timestep_features(2, 4, "prefix")[:, 1], torch.tensor([0.25, 0.25]))
    assert torch.allclose(timestep_features(8, 4, "rescaled")[:, 0], torch.arange(8) / 8)
    # training (r = K) is the same under both grids
    assert torch.equal(timestep_features(4, 4, "prefix"), timestep_features(4, 4, "rescaled"))
    with pytest.raises(LoopConfigError, match="needs num_loops <= 4"):
        timestep_features(5, 4, "prefix")


# ------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize("mech,extra", [
    (dict(initial_injection="scalar"), 1),
    (dict(initial_injection="channel"), 2 * D),
    (dict(initial_injection="residual_channel"), 2 * D),
    (dict(initial_injection="dense"), 2 * D * D),
    (dict(history_injection="scalar", history_window=4), 4),
    (dict(history_injection="channel", history_window=2), 2 * D),
    (dict(history_injection="dense", history_window=2), 2 * D * D),
    (dict(timestep="loop_gating"), 8),
    (dict(timestep="branch_gating"), 16 * 2),
    (dict(timestep="adaln"), 32 * D * 2),
    (dict(initial_injection="scalar", history_injection="channel", history_window=1, timestep="branch_gating"),
     1 + D + 32),
])
def test_extra_parameter_counts(mech, extra):
    base = make()
    model = make(**mech)
    assert model.num_parameters() - base.num_parameters() == extra
    assert model.num_parameters(backbone_only=True) == base.num_parameters()
    cond = [p for p in model.parameters() if p.looplm_role == "conditioning"]
    assert sum(p.numel() for p in cond) == extra  # every conditioning parameter is marked for AdamW


def test_paper_scale_conditioning_counts():
    # Qwen3-0.6B 4x7 (d = 1024): AdaLN adds 32*K*d with K = 4 core layers, BG 16*K, dense history w*d^2
    for mech, extra in [(dict(timestep="adaln"), 32 * 4 * 1024), (dict(timestep="branch_gating"), 16 * 4),
                        (dict(history_injection="dense", history_window=2), 2 * 1024 ** 2),
                        (dict(initial_injection="dense"), 2 * 1024 ** 2)]:
        cfg = build_model_config(dict(backbone="qwen3-0.6b", core_layers=4, train_loops=7, **mech))
        assert build_model(cfg, device="meta").num_parameters() == 218_507_264 + extra


def test_gradients_reach_every_conditioning_parameter_through_all_loops():
    model = make(initial_injection="dense", history_injection="channel", history_window=2, timestep="adaln",
                 train_loops=4)
    model.train()
    x = torch.randint(0, 2048, (2, 10))
    model(x, labels=x).loss.backward()
    for name, p in model.named_parameters():
        if p.looplm_role == "conditioning":
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name
    # beta_2 (lag 2) only acts from l = 3 on: a gradient proves the late loops are reached
    assert model.history_injection.beta.grad[1].abs().sum() > 0
    # loop gating: each loop's gate receives gradient (q sees sum over loops of psi_l * <grad, y_l - h_l>)
    lg = make(timestep="loop_gating", train_loops=4).train()
    lg(x, labels=x).loss.backward()
    assert (lg.loop_gating.q.grad.abs() > 0).all()
