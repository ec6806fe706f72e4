"""Ouro's learned exit gate (``model/exit_gate.py``; the gate, its exit distribution and Q-exit in
``hf/modeling_looplm.py``): the exit distribution and the Stage I / Stage II losses for a fixed gate
against hand computations, the gradient of the Stage I loss (``gradcheck`` in float64, the chunked
weighted cross-entropy included), the objective of ``LoopLM.forward`` against per-r forwards of the same
model, Q-exit decisions against the closed form of a constant gate, the parameter count, and the
settings refused with one line."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_loop.config import build_model_config
from megatron_loop.config.sections import Config, TrainConfig
from megatron_loop.errors import LoopConfigError
from megatron_loop.hf.modeling_looplm import ExitCDF, exit_distribution
from megatron_loop.model.exit_gate import ExitObjective, adaptive_gate_loss, entropy_regularized_loss
from megatron_loop.model.looplm import build_model
from megatron_loop.model.loss import (IGNORE_INDEX, chunked_linear_cross_entropy, token_linear_cross_entropy,
                                      weighted_linear_cross_entropy)
from megatron_loop.plan import count_parameters


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_exit_distribution_is_ouros_with_the_remainder_at_the_last_step():
    # lambda = 0.2, 0.5, 0.25, (0.9 unused): p = 0.2, 0.8*0.5, 0.4*0.25, the rest 0.3 (Ouro Sec. 3.2)
    logits = torch.tensor([[_logit(0.2), _logit(0.5), _logit(0.25), _logit(0.9)]])
    torch.testing.assert_close(exit_distribution(logits), torch.tensor([[0.2, 0.4, 0.1, 0.3]]))
    # modeling_ouro.py's loop (remaining_prob), written out: the same numbers on random gates
    gates = torch.randn(5, 6)
    remaining, pdf = torch.ones(5), []
    for t in range(6):
        lam = torch.sigmoid(gates[:, t])
        pdf.append(lam * remaining if t < 5 else remaining)
        remaining = remaining * (1 - lam)
    torch.testing.assert_close(exit_distribution(gates), torch.stack(pdf, -1))
    # a saturated gate: in log space the remainder is exp(-60), not the 1 - sigmoid(60) = 0 of fp32 products
    saturated = exit_distribution(torch.tensor([[60.0, 0.0]]))
    assert saturated[0, 0] == 1.0 and saturated[0, 1].item() == pytest.approx(math.exp(-60), rel=1e-5)


def test_stage_one_loss_for_a_fixed_gate_equals_the_hand_computation():
    torch.manual_seed(0)
    n, d, v, steps, beta = 7, 4, 11, 3, 0.1
    hidden = [torch.randn(n, d) for _ in range(steps)]
    weight, gates = torch.randn(v, d), torch.randn(n, steps)
    targets = torch.randint(0, v, (n,))
    targets[2] = IGNORE_INDEX
    got = entropy_regularized_loss(hidden, weight, targets, gates, beta, chunk_size=3)
    p = exit_distribution(gates)
    valid = targets != IGNORE_INDEX
    per_step = torch.stack([F.cross_entropy(h @ weight.t(), targets, ignore_index=IGNORE_INDEX, reduction="none")
                            for h in hidden], -1)  # [n, T]
    entropy = -(p * p.log()).sum(-1)
    want = ((p * per_step).sum(-1) - beta * entropy)[valid].mean()
    torch.testing.assert_close(got, want)
    # with beta = 0 and a gate certain to exit at the last step: the plain loss at T
    certain = torch.full((n, steps), -60.0)
    torch.testing.assert_close(entropy_regularized_loss(hidden, weight, targets, certain, 0.0),
                               chunked_linear_cross_entropy(hidden[-1], weight, targets), rtol=1e-6, atol=1e-6)


def test_weighted_cross_entropy_with_unit_weights_is_the_chunked_loss_and_per_token_losses_match():
    torch.manual_seed(1)
    h, w, y = torch.randn(9, 5, requires_grad=True), torch.randn(13, 5, requires_grad=True), torch.randint(0, 13, (9,))
    y[4] = IGNORE_INDEX
    ours = weighted_linear_cross_entropy(h, w, y, torch.ones(9), chunk_size=4)
    ref = chunked_linear_cross_entropy(h, w, y, chunk_size=4)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours, (h, w)), torch.autograd.grad(ref, (h, w)))
    rows = F.cross_entropy(h @ w.t(), y, ignore_index=IGNORE_INDEX, reduction="none")
    torch.testing.assert_close(token_linear_cross_entropy(h, w, y, chunk_size=4), rows.detach())


def test_stage_one_gradient_is_checked_numerically_in_float64():
    torch.manual_seed(2)
    n, d, v, steps = 5, 3, 7, 3
    hidden = [torch.randn(n, d, dtype=torch.float64, requires_grad=True) for _ in range(steps)]
    weight = torch.randn(v, d, dtype=torch.float64, requires_grad=True)
    gates = torch.randn(n, steps, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    targets[1] = IGNORE_INDEX

    def loss(w, g, *hs):
        return entropy_regularized_loss(list(hs), w, targets, g, 0.3, chunk_size=2)

    assert torch.autograd.gradcheck(loss, (weight, gates, *hidden), eps=1e-6, atol=1e-7)
    # Stage II: the gate's loss in its logits (the per-step losses are detached inputs)
    step_losses = torch.rand(n, steps, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda g: adaptive_gate_loss(step_losses, g, targets != IGNORE_INDEX, 50.0, 0.005),
                                    (gates,), eps=1e-6, atol=1e-7)


def test_stage_two_loss_for_a_fixed_gate_equals_the_hand_computation():
    # one token, losses 3.0 -> 2.0 -> 1.999: improvements 1.0 (continue) and 0.001 < gamma (stop)
    losses = torch.tensor([[3.0, 2.0, 1.999], [1.0, 1.0, 1.0]])
    gates = torch.tensor([[0.3, -0.4, 1.2], [0.0, 0.0, 0.0]], requires_grad=True)
    k, gamma = 50.0, 0.005
    got = adaptive_gate_loss(losses, gates, torch.tensor([True, False]), k, gamma)
    terms = []
    for improvement, a in ((1.0, -0.4), (0.001, 1.2)):
        w = 1 / (1 + math.exp(-k * (improvement - gamma)))
        lam = 1 / (1 + math.exp(-a))
        terms.append(-(w * math.log(1 - lam) + (1 - w) * math.log(lam)))  # BCE(1 - lambda, w)
    assert got.item() == pytest.approx(sum(terms) / 2, rel=1e-6)
    got.backward()
    assert gates.grad[1].abs().sum() == 0 and gates.grad[0, 0] == 0  # ignored token; lambda_1 has no target


def _model(**model):
    torch.manual_seed(0)
    cfg = build_model_config(dict(dict(backbone="tiny-llama", prelude_layers=1, core_layers=1, train_loops=3,
                                       coda_layers=1, vocab_size=96, exit_gate="learned",
                                       recompute="none"), **model))
    return build_model(cfg)


@pytest.mark.parametrize("ouro_norms", [{}, {"loop_norm": True, "block_norm": "branch_output", "coda_layers": 0}])
def test_the_training_objective_of_the_forward_reads_the_prediction_at_every_r(ouro_norms):
    """Stage I from LoopLM.forward (train mode, labels) == sum_t p(t) CE(forward at r = t) - beta H(p), per token:
    the per-step readouts are the model's own predictions at r = t (Coda included); also with Ouro's norms
    (the between-loop norm: the gate and the head read the normed state once)."""
    model = _model(**ouro_norms)
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, 0.5)
    x = torch.randint(0, 96, (2, 8))
    x[1, 5] = 3
    labels = x.clone()
    labels[0, 4] = IGNORE_INDEX
    objective = ExitObjective.of(TrainConfig(exit_gate_objective="entropy_regularized", exit_entropy_beta=0.2))
    got = model.train()(x, num_loops=3, labels=labels, compute_logits=False, objective=objective).loss
    with torch.no_grad():
        model.eval()
        p = model(x, num_loops=3).exit_pdf[:, :-1].reshape(-1, 3)
        target = labels[:, 1:].reshape(-1)
        ce = torch.stack([F.cross_entropy(model(x, num_loops=t).logits[:, :-1].reshape(-1, 96), target,
                                          reduction="none") for t in (1, 2, 3)], -1)
        keep = target != IGNORE_INDEX
        want = ((p * ce).sum(-1) + 0.2 * (p * p.log()).sum(-1))[keep].mean()
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-5)
        # eval mode: the loss stays the cross-entropy of the prediction at r (validation, comparable)
        torch.testing.assert_close(model(x, num_loops=3, labels=labels).loss,
                                   F.cross_entropy(model(x, num_loops=3).logits[:, :-1].reshape(-1, 96), target,
                                                   ignore_index=IGNORE_INDEX))


def test_stage_two_trains_the_gate_only():
    model = _model()
    objective = ExitObjective.of(TrainConfig(exit_gate_objective="adaptive_gate"))
    objective.prepare(model)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["exit_gate.bias", "exit_gate.weight"]
    x = torch.randint(0, 96, (2, 8))
    model.train()(x, num_loops=3, labels=x, compute_logits=False, objective=objective).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.exit_gate.parameters())
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("exit_gate."))


def test_q_exit_decisions_equal_the_closed_form_of_a_constant_gate():
    """w = 0, b = logit(lambda): every token's CDF(t) = 1 - (1 - lambda)^t, so it exits at the first t with
    1 - (1 - lambda)^t >= q (the cap r otherwise), and its logits are those of the fixed model at that r."""
    model = _model().eval()
    x = torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        model.exit_gate.weight.zero_()
        model.exit_gate.bias.fill_(_logit(0.4))
        for q, want in ((0.0, 1), (0.35, 1), (0.5, 2), (0.7, 3), (0.8, 4), (0.9, 5), (1.0, 5)):
            out = model(x, num_loops=5, exit_criterion="q_exit", exit_threshold=q)
            assert bool((out.exit_loops == want).all()), (q, out.exit_loops)
            assert torch.equal(out.logits, model(x, num_loops=want).logits)
    # per token, online: CDF accumulated loop by loop as sum_j lambda_j S_{j-1}
    cdf = ExitCDF((2,), "cpu")
    lams = [(0.5, 0.1), (0.5, 0.2), (0.5, 0.5)]
    values = [cdf.update(torch.tensor([_logit(a), _logit(b)])).tolist() for a, b in lams]
    for got, want in zip(values, [(0.5, 0.1), (0.75, 0.1 + 0.9 * 0.2), (0.875, 0.28 + 0.72 * 0.5)]):
        assert got == pytest.approx(list(want), abs=1e-6)


def test_settings_without_a_gate_or_out_of_range_are_refused_with_one_line():
    x = torch.randint(0, 96, (1, 4))
    with pytest.raises(LoopConfigError, match="^exit_criterion='q_exit' exits on the learned exit gate's"):
        _model(exit_gate="none")(x, exit_criterion="q_exit", exit_threshold=0.5)
    with pytest.raises(LoopConfigError, match=r"^exit_threshold=1.5 with exit_criterion='q_exit': expected q in"):
        _model()(x, exit_criterion="q_exit", exit_threshold=1.5)
    base = dict(model=build_model_config(dict(backbone="tiny-llama", exit_gate="learned")))
    for cfg, match in ((Config(**base), "^train.exit_gate_objective='none' with model.exit_gate='learned'"),
                       (Config(train=TrainConfig(exit_gate_objective="entropy_regularized")),
                        "^train.exit_gate_objective='entropy_regularized' with model.exit_gate='none'")):
        with pytest.raises(LoopConfigError, match=match):
            cfg.validate()
    tp = Config(**base, train=TrainConfig(exit_gate_objective="entropy_regularized"))
    tp.parallel.tensor_model_parallel_size = 2
    with pytest.raises(LoopConfigError, match=r"^model.exit_gate='learned': expected "
                                              r"parallel.tensor_model_parallel_size=1"):
        tp.validate()


def test_the_parameter_count_includes_the_gate():
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=2, train_loops=3, exit_gate="learned"))
    plain = build_model_config(dict(backbone="tiny-llama", core_layers=2, train_loops=3))
    count = count_parameters(cfg)
    assert count.total == build_model(cfg, device="meta").num_parameters() == \
        count_parameters(plain).total + cfg.hidden_size + 1
    assert count.backbone == count_parameters(plain).backbone


def test_train_flops_count_the_readout_after_every_loop():
    """Stage I reads the Coda and the head out after each of r loops: r - 1 readouts more than the plain step."""
    from megatron_loop.flops import block_forward_flops_per_token, train_flops_per_token

    fields = dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=4, coda_layers=1)
    plain, gated = build_model_config(fields), build_model_config(dict(fields, exit_gate="learned"))
    readout = block_forward_flops_per_token(plain, 128) + 2 * plain.hidden_size * plain.vocab_size
    for r, backprop in ((4, None), (6, 2)):
        assert train_flops_per_token(gated, 128, r, backprop) == pytest.approx(
            train_flops_per_token(plain, 128, r, backprop) + 3 * (r - 1) * readout)
