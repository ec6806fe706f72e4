"""MuonAdamW on whole weights (single process): Muon per projection, AdamW exactly, clipping.

Reference: ``torch.optim.Muon(adjust_lr_fn=...)`` on the unfused twin's separate q/k/v/gate/up
matrices plus ``torch.optim.AdamW`` on everything else, fed bitwise-identical gradients.
Tolerance: weights agree to 1e-6 absolute (fp32; observed <= 6e-8 from rounding of the
folded ``lr * scale`` factor) and AdamW weights bitwise.
"""

from __future__ import annotations

import pytest
import torch

import optim_toy as toy
from megatron_loop.model import roles
from megatron_loop.optim import MuonAdamW, muon_scale, newton_schulz, role_param_groups

LR, WD = 0.02, 0.1
ATOL = 1e-6


def reference_optimizers(twin: toy.UnfusedToy, rule: str = "match_rms_adamw"):
    muon = torch.optim.Muon(
        twin.matrices(), lr=LR, weight_decay=WD, momentum=0.95, nesterov=True, adjust_lr_fn=rule
    )
    adamw = torch.optim.AdamW(twin.others(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD)
    return [muon, adamw]


def make_pair(rule: str = "match_rms_adamw", clip: float | None = None):
    weights = toy.initial_weights()
    model, twin = toy.FusedToy(weights), toy.UnfusedToy(weights)
    optimizer = MuonAdamW(role_param_groups(model), lr=LR, weight_decay=WD, muon_scale=rule, clip_grad=clip)
    return model, optimizer, twin, reference_optimizers(twin, rule)


def backward_both(model, twin, tokens, multiplier=1.0, exact: bool = True) -> None:
    """Same loss on both; from identical weights the gradients agree bitwise."""
    model(tokens, multiplier).backward()
    twin(tokens, multiplier).backward()
    fused_grads = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in toy.UnfusedToy.fused(_GradView(twin)).items():
        if exact:
            assert torch.equal(fused_grads[name], grad), f"twin gradients differ on {name}"
        else:
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6 * abs(multiplier))


class _GradView:
    """Lets ``UnfusedToy.fused`` assemble the twin's gradients instead of its weights."""

    def __init__(self, twin: toy.UnfusedToy) -> None:
        self._twin = twin

    def __getattr__(self, name: str) -> torch.Tensor:
        return getattr(self._twin, name).grad


def assert_matches_twin(model: toy.FusedToy, twin: toy.UnfusedToy, adamw_bitwise: bool = True) -> None:
    expected = {name: w.detach() for name, w in twin.fused().items()}
    for name, param in model.named_parameters():
        if roles.uses_muon(param) or not adamw_bitwise:
            torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=ATOL, msg=name)
        else:  # AdamW is torch's own functional AdamW: bitwise from identical gradients
            assert torch.equal(param.detach(), expected[name]), name


def test_groups_come_from_roles_not_names():
    model = toy.FusedToy(toy.initial_weights())
    groups = {group["name"]: group["params"] for group in role_param_groups(model)}
    assert [p.shape for p in groups["muon"]] == [model.qkv.shape, model.proj.shape, model.fc1.shape, model.fc2.shape]
    assert {id(p) for p in groups["adamw"]} == {
        id(p) for p in (model.embedding, model.cond_vector, model.cond_scalar, model.norm1, model.norm2, model.head)
    }
    untagged = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no role"):
        role_param_groups(untagged)


@pytest.mark.parametrize("rule", ["match_rms_adamw", "original"])
def test_one_step_orthogonal_per_projection_and_adamw_exact(rule):
    model, optimizer, twin, reference = make_pair(rule)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    # 16 sequences: gradients of full rank (with 2, k and v of the toy are nearly rank one and
    # 5 Newton-Schulz steps cannot lift singular values ~1e-7 of the largest)
    backward_both(model, twin, toy.batch(0, 0, 0, size=16))
    grads_before = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    for opt in reference:
        opt.step()
    assert_matches_twin(model, twin)

    for name, param in model.named_parameters():
        if not roles.uses_muon(param):
            continue
        # the Muon direction: the weight change without its decoupled weight-decay part
        update = -(param.detach() - before[name] * (1 - LR * WD)) / LR
        rows_list = roles.projection_rows(param) or [torch.arange(param.shape[0])]
        for rows in rows_list:
            sub = update[rows] / muon_scale(update[rows].shape, rule)
            sigma = torch.linalg.svdvals(sub)
            grad_sigma = torch.linalg.svdvals(grads_before[name][rows])
            # 5 quintic Newton-Schulz steps put every singular value in ~[0.68, 1.14] ...
            assert sigma.min() > 0.6 and sigma.max() < 1.2, (name, sigma)
            # ... although the raw gradient's spectrum is spread over more than a decade
            assert grad_sigma.max() / grad_sigma.min() > 10.0, (name, grad_sigma)


def test_fused_qkv_is_not_orthogonalised_whole():
    """The per-projection decision is observable: orthogonalising the fused QKV as one matrix
    would give a different update."""
    model, optimizer, twin, reference = make_pair()
    before = model.qkv.detach().clone()
    backward_both(model, twin, toy.batch(0, 0, 0))
    grad = model.qkv.grad.clone()
    optimizer.step()
    per_projection = -(model.qkv.detach() - before * (1 - LR * WD)) / LR
    direction = grad * (1 - 0.95**2)  # Nesterov input after one step from zero momentum
    whole = newton_schulz(direction) * muon_scale(direction.shape)
    assert (per_projection - whole).abs().max() > 0.05


def test_several_steps_with_clipping_match_reference():
    """clip_grad on the optimizer (single process / ZeRO stage 0): raw gradients are clipped
    with one global norm before the update, as torch.nn.utils.clip_grad_norm_ does."""
    model, optimizer, twin, reference = make_pair(clip=1.0)
    for step, multiplier in enumerate([1.0, 1.0, 1e6, 1.0]):
        optimizer.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
        backward_both(model, twin, toy.batch(step, 0, 0), multiplier, exact=step == 0)
        raw_norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        optimizer.step()
        for opt in reference:
            opt.step()
        assert optimizer._global_grad_norm == pytest.approx(float(raw_norm), rel=1e-5)
        assert_matches_twin(model, twin, adamw_bitwise=step == 0)
    assert optimizer._global_grad_norm < 10  # the last step is a normal one again


def test_muon_state_is_in_state_dict_and_round_trips():
    model, optimizer, twin, _ = make_pair()
    backward_both(model, twin, toy.batch(0, 0, 0))
    optimizer.step()
    state = optimizer.state_dict()
    momentum = state["state"][0]["momentum_buffer"]
    assert momentum.dtype == torch.float32 and momentum.abs().sum() > 0
    fresh_model = toy.FusedToy(toy.initial_weights(seed=1))
    fresh = MuonAdamW(role_param_groups(fresh_model), lr=LR)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.state[fresh_model.qkv]["momentum_buffer"], optimizer.state[model.qkv]["momentum_buffer"])
    assert [g["name"] for g in fresh.param_groups] == ["muon", "adamw"]


# ------------------------------------------------ grouping switches (train.optimizer, muon_conditioning_matrices)
def _conditioned_looplm():
    """A tiny LoopLM with every kind of conditioning matrix: dense initial injection W [d, 2d],
    dense history B [w, d, d] (a StackSplit stack) and AdaLN W [2d, 8] (timestep, never Muon),
    with seeded random gradients on every parameter."""
    from megatron_loop import build_model
    from megatron_loop.config import build_model_config

    torch.manual_seed(0)
    model = build_model(build_model_config(dict(
        backbone="tiny-qwen", core_layers=1, train_loops=3, initial_injection="dense", history_injection="dense",
        history_window=2, timestep="adaln", recompute="none")))
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    return model


def _ids(params) -> set[int]:
    return {id(p) for p in params}


def test_groups_for_each_optimizer_switch():
    model = _conditioned_looplm()
    matrices = _ids(p for p in model.parameters() if roles.role_of(p) == roles.MATRIX)
    dense = _ids([model.initial_injection.weight, model.history_injection.beta])
    everything = _ids(model.parameters())

    def groups(**kw):
        return {g["name"]: _ids(g["params"]) for g in role_param_groups(model, **kw)}

    default = groups()  # App. C.2 as read originally: dense injection matrices with AdamW
    assert default["muon"] == matrices and default["adamw"] == everything - matrices
    moved = groups(muon_conditioning_matrices=True)
    assert moved["muon"] == matrices | dense and moved["adamw"] == everything - matrices - dense
    adaln = _ids(p for n, p in model.named_parameters() if "adaln" in n)
    assert adaln and adaln <= moved["adamw"]  # timestep matrices stay with AdamW
    assert groups(optimizer="adamw") == {"adamw": everything}  # App. D.1 ablation
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        role_param_groups(model, optimizer="sgd")


def test_dense_conditioning_matrices_under_muon_match_torch_muon():
    """W = [W_h W_0] is one projection; each lag's B_j is orthogonalised on its own."""
    model = _conditioned_looplm()
    inj, beta = model.initial_injection.weight, model.history_injection.beta
    refs = [torch.nn.Parameter(inj.detach().clone())] + [torch.nn.Parameter(b.detach().clone()) for b in beta]
    for ref, grad in zip(refs, [inj.grad, *beta.grad]):
        ref.grad = grad.clone()
    optimizer = MuonAdamW(role_param_groups(model, muon_conditioning_matrices=True), lr=LR, weight_decay=WD)
    optimizer.step()
    torch.optim.Muon(refs, lr=LR, weight_decay=WD, momentum=0.95, nesterov=True,
                     adjust_lr_fn="match_rms_adamw").step()
    torch.testing.assert_close(inj.detach(), refs[0].detach(), rtol=0, atol=ATOL)
    for j in range(beta.shape[0]):
        torch.testing.assert_close(beta[j].detach(), refs[1 + j].detach(), rtol=0, atol=ATOL)


def test_adamw_ablation_is_torch_adamw_on_every_parameter():
    model = _conditioned_looplm()
    twin = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for t, p in zip(twin, model.parameters()):
        t.grad = p.grad.clone()
    MuonAdamW(role_param_groups(model, optimizer="adamw"), lr=LR, weight_decay=WD).step()
    torch.optim.AdamW(twin, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD).step()
    for t, p in zip(twin, model.parameters()):
        assert torch.equal(t.detach(), p.detach())
