"""``training/dynamics.py``: the loop dynamics logged while training, against the model's own
forward (trajectory, loss at each r) and the conditioning modules' own gate computations."""

from __future__ import annotations

import pytest
import torch

from megatron_loop import build_model
from megatron_loop.config import build_model_config
from megatron_loop.training.dynamics import gate_values, loop_dynamics

K = 3


def make(**kw):
    base = dict(backbone="tiny-qwen", core_layers=2, train_loops=K, recompute="none", **kw)
    torch.manual_seed(0)
    model = build_model(build_model_config(base))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # gates away from their identity initialisation
        for p in model.parameters():
            if p.looplm_role == "conditioning":
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def test_state_statistics_and_losses_follow_the_models_forward():
    model = make(initial_injection="channel")
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    model.train()
    values = loop_dynamics(model, model, tokens)
    assert model.training  # the training mode is restored
    with torch.no_grad():
        trajectory = model.eval()(tokens, num_loops=K + 1, return_trajectory=True).trajectory
        losses = {r: model(tokens, num_loops=r, labels=tokens).loss.item() for r in (K - 1, K, K + 1)}
    d = model.config.hidden_size
    for l, h in enumerate(trajectory):  # h_0 (the Prelude output) .. h_{K+1}
        rms = torch.linalg.vector_norm(h, dim=-1) / d ** 0.5
        assert values[f"state_norm_l{l}"] == pytest.approx(rms.mean().item(), rel=1e-5)
    for l in range(1, K + 2):
        prev, cur = trajectory[l - 1], trajectory[l]
        rel = torch.linalg.vector_norm(cur - prev, dim=-1) / torch.linalg.vector_norm(prev, dim=-1)
        assert values[f"relative_update_l{l}"] == pytest.approx(rel.mean().item(), rel=1e-5)
    assert f"relative_update_l{K + 2}" not in values and "relative_update_l0" not in values
    for r, loss in losses.items():
        assert values[f"batch_loss_r{r}"] == pytest.approx(loss, rel=1e-6)
    assert not any(k.startswith(("loop_gate", "branch_gate", "adaln")) for k in values)  # no timestep conditioning


@pytest.mark.parametrize("timestep", ["loop_gating", "branch_gating", "adaln"])
def test_gates_are_the_conditioning_modules_own_values(timestep):
    model = make(timestep=timestep)
    psi = model._timestep_features(K, model.config.timestep_grid, torch.device("cpu"))
    values = gate_values(model, psi)
    with torch.no_grad():
        for l in range(1, K + 1):
            p = psi[l - 1]
            if timestep == "loop_gating":  # h + g (y - h) at h = 0, y = 1 is g
                expected = {"loop_gate": model.loop_gating(torch.zeros(1), torch.ones(1), p).item()}
            elif timestep == "branch_gating":
                expected = {f"branch_gate_{b}": sum(getattr(blk, f"{b}_gate")(p)[0].item() for blk in model.core)
                            / len(model.core) for b in ("attn", "mlp")}
            else:
                expected = {f"adaln_scale_{b}": sum(getattr(blk, f"{b}_adaln")(p)[0].mean().item() for blk in model.core)
                            / len(model.core) for b in ("attn", "mlp")}
            for name, value in expected.items():
                assert value != pytest.approx(1.0)  # the randomised gates moved away from the identity
                assert values[f"{name}_l{l}"] == pytest.approx(value, rel=1e-5)
    assert len(values) == K * (1 if timestep == "loop_gating" else 2)
