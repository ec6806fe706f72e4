"""Activation recomputation modes, applied from outside the model (``model/recompute.py``): identical
gradients in every mode, the auto planner, and the memory model against measured CPU peaks
(``measure.memory.peak_memory_delta``)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop import build_model
from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopConfigError
from torch.utils.checkpoint import CheckpointPolicy

from megatron_loop.model import recompute
from megatron_loop.model.recompute import (FULL, NONE, SELECTIVE, LoopMemory, loop_memory, schedule_loops,
                                               predicted_peak)
from megatron_loop.measure.memory import peak_memory_delta
from megatron_loop.model.recompute import RecomputeSettings
from megatron_loop.parallel.parallelize import apply_recompute, count_pending_memory

MODES = ("none", "per_loop", "selective", "auto", "per_block")
CPU = torch.device("cpu")


def _model(backbone="tiny-llama", **kw):
    base = dict(backbone=backbone, prelude_layers=1, core_layers=2, coda_layers=1, train_loops=4,
                recompute="none")
    base.update(kw)
    torch.manual_seed(0)
    model = build_model(build_model_config(base))
    apply_recompute(model, RecomputeSettings.from_config(model.config))
    return model


def _checkpoint(model, mode, budget_gib=None, selective_cost=None):
    """Re-apply recomputation to ``model`` (replacing the last plan); returns what was applied."""
    return apply_recompute(model, RecomputeSettings(mode, budget_gib, selective_cost))


def _step(model, x):
    def step():
        model.zero_grad(set_to_none=True)
        model(x, labels=x, compute_logits=False).loss.backward()
    return step


@pytest.mark.parametrize("timestep", ["branch_gating", "adaln"])
def test_every_mode_gives_bitwise_identical_gradients(timestep):
    model = _model("tiny-qwen", timestep=timestep, initial_injection="channel", history_injection="scalar",
                   history_window=2)
    for p in model.parameters():  # conditioning away from its identity start, so that it matters
        if p.looplm_role == "conditioning":
            torch.nn.init.normal_(p, std=0.1)
    x = torch.randint(0, 2048, (2, 16))
    grads = {}
    for mode in MODES:
        applied = _checkpoint(model, mode, 0.0005 if mode == "auto" else None)  # auto: the budget forces a mix
        _step(model, x)()
        grads[mode] = [p.grad.clone() for p in model.parameters()]
        if mode == "auto":
            assert applied.schedules, "auto planned nothing"
            assert len(set(next(iter(applied.schedules.values())).kinds)) > 1  # a real mix of kinds
    for mode in MODES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[mode], grads["none"])), mode


def test_selective_policy_keeps_every_other_matmul_and_attention(monkeypatch):
    """torchtitan's op policy: per block, the 1st and 3rd matmuls (fused QKV, fused gate/up) and the
    attention kernel are kept; the output and down projections and all elementwise work are
    recomputed (torch asks the policy in the forward; the recomputation replays its decisions)."""
    decisions = []  # (is_recompute, op, output width of a matmul, decision)
    make = recompute.selective_policy

    def recording():
        policy = make()

        def record(ctx, op, *args, **kwargs):
            decision = policy(ctx, op, *args, **kwargs)
            width = args[1].shape[-1] if op in recompute.policy_ops()[1] else None
            decisions.append((ctx.is_recompute, op, width, decision))
            return decision
        return record

    monkeypatch.setattr(recompute, "selective_policy", recording)
    model = _model("tiny-qwen", prelude_layers=0, core_layers=1, coda_layers=0, train_loops=2,
                   recompute="selective", timestep="adaln")  # AdaLN adds mv ops (not matmuls)
    cfg = model.config
    x = torch.randint(0, 2048, (2, 16))
    _step(model, x)()
    save, again = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    seen = [d for d in decisions if not d[0]]  # one selective loop of one block
    matmuls = [(width, decision) for _, op, width, decision in seen if width is not None]
    assert matmuls == [(qkv, save), (cfg.hidden_size, again), (2 * cfg.intermediate_size, save),
                       (cfg.hidden_size, again)], matmuls
    kept = {op for _, op, width, decision in seen if decision == save and width is None}
    assert kept and kept <= recompute.policy_ops()[0], kept
    assert sum(d == save for *_, d in seen) == 3  # nothing else is kept: norms, RoPE, SwiGLU, AdaLN recomputed


@pytest.mark.parametrize("cost", [None, 0.9])
def test_selective_cost_is_the_config_key_or_the_flop_share(cost):
    """``recompute_selective_cost`` prices a selective loop in the plan; null prices it
    at the FLOP share of the two recomputed matmuls, which changes the plan at the same budget:
    at 0.9 three selective loops (2.7) cost more than two recomputed loops (2.0), which also fit."""
    from megatron_loop.flops import block_forward_flops_per_token
    model = _model(recompute="auto", recompute_selective_cost=cost)
    cfg, seq = model.config, 64
    x = torch.randint(0, 2048, (2, seq))
    mem = loop_memory(cfg, 2, seq, 4, model.loss_chunk_tokens, 4 * model.num_parameters())
    budget = predicted_peak((SELECTIVE,) * 3 + (NONE,), mem)  # three selective loops fit exactly
    applied = _checkpoint(model, "auto", budget / 2**30, cost)
    _step(model, x)()
    plan = next(iter(applied.schedules.values()))
    d, f, q = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim
    share = 2 * (q * d + f * d) / block_forward_flops_per_token(cfg, seq)
    assert plan.selective_cost == pytest.approx(share if cost is None else cost)
    assert plan.kinds == ((SELECTIVE,) * 3 + (NONE,) if cost is None else (FULL, FULL, NONE, NONE))
    assert plan.fits and f"selective loop {plan.selective_cost:.2f}" in applied.new_schedules()[0]


def test_planner_picks_the_cheapest_plan_that_fits():
    mem = LoopMemory(none=100, selective=40, full=5, fixed=50)
    assert schedule_loops(4, mem, None, 0.25).kinds == (NONE,) * 4  # no limit: recompute nothing
    assert schedule_loops(4, mem, 450, 0.25).kinds == (NONE,) * 4  # 50 + 400
    # 50 + 40 + 3 x 100 = 390 fits 400 at the cost of one selective loop (0.25)
    assert schedule_loops(4, mem, 400, 0.25).kinds == (SELECTIVE, NONE, NONE, NONE)
    # 250: one recomputed loop + two selective + one stored = 50 + 5 + 80 + 100 = 235 (cost 1.5),
    # cheaper than three selective loops, which would need 50 + 120 + 100 = 270
    plan = schedule_loops(4, mem, 250, 0.25)
    assert plan.kinds == (FULL, SELECTIVE, SELECTIVE, NONE) and plan.fits and plan.peak_bytes == 235
    # below the per_loop floor (50 + 3 x 5 + 100): per_loop, reported as not fitting
    tight = schedule_loops(4, mem, 100, 0.25)
    assert tight.kinds == (FULL, FULL, FULL, NONE) and not tight.fits
    # backward recomputes a recomputed loop in full while the loops before it are alive
    assert predicted_peak((NONE, FULL, NONE), mem) == max(50 + 205, 50 + 100 + 100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backbone", ["tiny-llama", "tiny-qwen"])
def test_memory_model_follows_measured_peak(backbone, dtype):
    """fp32, and bf16 as DeepSpeed's bf16 engine runs the model (weights, activations and gradients in
    bf16; the loss's fp32 logits chunk and head-gradient accumulator stay fp32)."""
    model = _model(backbone).to(dtype)
    batch, seq = 2, 64
    x = torch.randint(0, 2048, (batch, seq))
    size = dtype.itemsize
    mem = loop_memory(model.config, batch, seq, size, model.loss_chunk_tokens, size * model.num_parameters())
    kinds = {"none": (NONE,) * 4, "per_loop": (FULL,) * 3 + (NONE,), "selective": (SELECTIVE,) * 3 + (NONE,)}
    for mode, plan in kinds.items():
        _checkpoint(model, mode)
        step = _step(model, x)
        step()
        measured = peak_memory_delta(step, CPU)
        # within 2 %: a recomputation intermediate may or may not still be alive at the peak
        assert measured == pytest.approx(predicted_peak(plan, mem), rel=0.02), mode
    # auto under a budget between per_loop and none: the plan fits and the measured peak obeys it
    budget = (predicted_peak(kinds["per_loop"], mem) + predicted_peak(kinds["none"], mem)) / 2
    applied = _checkpoint(model, "auto", budget / 2**30)
    step = _step(model, x)
    step()
    plan = next(iter(applied.schedules.values()))
    assert plan.fits and NONE in plan.kinds and plan.kinds != kinds["none"]
    measured = peak_memory_delta(step, CPU)
    assert measured <= budget and measured == pytest.approx(plan.peak_bytes, rel=0.02)


def test_device_budget_counts_what_the_first_step_allocates(monkeypatch):
    """Without a budget, ``auto`` plans within 90 % of the device minus what is allocated minus what
    the first optimizer step (Muon momentum, AdamW moments) and DeepSpeed's buckets will add; at a
    device size where the stored plan fits only if the optimizer state is forgotten, it checkpoints,
    and the plan says what it assumed."""
    from megatron_loop.model import roles
    from megatron_loop.optim import MuonAdamW, role_param_groups
    from megatron_loop.optim.memory import unallocated_optimizer_state

    model = _model(recompute="auto")
    optimizer = MuonAdamW(role_param_groups(model), lr=1e-3)
    muon = sum(p.numel() for p in model.parameters() if roles.uses_muon(p))
    state = 4 * (muon + 2 * (model.num_parameters() - muon))  # fp32 momentum; two fp32 moments
    buckets = 2**16
    count_pending_memory(model, lambda: recompute.PendingMemory(unallocated_optimizer_state(optimizer), buckets))
    batch, seq = 2, 64
    x = torch.randint(0, 2048, (batch, seq))
    mem = loop_memory(model.config, batch, seq, 4, model.loss_chunk_tokens, 4 * model.num_parameters())
    allocated = 10 * 2**20
    # room for the stored plan plus half the optimizer state: enough only if the state is ignored
    total = (predicted_peak((NONE,) * 4, mem) + state / 2 + allocated) / 0.9
    monkeypatch.setattr(recompute, "device_memory", lambda device: (int(total), allocated))
    _step(model, x)()
    plan = next(iter(model.recompute.schedules.values()))
    assert plan.budget.pending == recompute.PendingMemory(state, buckets)
    assert plan.budget.bytes == pytest.approx(0.9 * int(total) - allocated - state - buckets)
    assert plan.fits and plan.kinds != (NONE,) * 4 and plan.peak_bytes <= plan.budget.bytes
    line = model.recompute.new_schedules()[0]
    assert "optimizer state not yet allocated" in line and "DeepSpeed buckets" in line
    optimizer.step()
    assert unallocated_optimizer_state(optimizer) == 0  # once created it is in the allocated figure


def test_config_keys():
    cfg = build_model_config(dict(backbone="tiny-llama", recompute="auto",
                                  recompute_budget_gib=40))
    assert cfg.recompute_budget_gib == 40.0
    assert cfg.recompute_selective_cost is None
    with pytest.raises(LoopConfigError, match="recompute_selective_cost"):
        build_model_config(dict(backbone="tiny-llama", recompute="auto",
                                recompute_selective_cost=1.5))
    with pytest.raises(LoopConfigError, match="recompute_selective_cost"):
        build_model_config(dict(backbone="tiny-llama", recompute="selective",
                                recompute_selective_cost=0.3))
    with pytest.raises(LoopConfigError, match="recompute_budget_gib"):
        build_model_config(dict(backbone="tiny-llama", recompute="per_loop",
                                recompute_budget_gib=40))
    with pytest.raises(LoopConfigError, match="recompute="):
        build_model_config(dict(backbone="tiny-llama", recompute="some"))
