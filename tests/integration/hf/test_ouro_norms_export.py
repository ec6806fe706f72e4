"""Ouro's between-loop norm (``model.loop_norm``), its branch-output norms (``model.block_norm: branch_output``)
and its weighted-exit inference (the export's ``weighted_exit``), each against a float64 reference written from
the equations of ByteDance's modeling_ouro.py (Ouro-1.4B file): ``OuroDecoderLayer.forward`` (lines 413-434:
``residual + input_layernorm_2(attn(input_layernorm(x)))``, then the MLP likewise), ``OuroModel.forward``
(lines 604-620: ``hidden_states = self.norm(hidden_states)`` after every UT step, the gate on that state) and
``compute_expected_logits`` (lines 738-760, used at 813-814: sum_t p(t|x) lm_head(h^t)); and the export equal to
the training model at r = 1, K, 2K with these settings. The reference calls the export's attention and MLP (the
Llama branches every other export test checks) and composes everything Ouro adds by hand.
"""

from __future__ import annotations

import pytest
import torch

from megatron_loop.config import build_model_config
from megatron_loop.export.convert import export_state_dict
from megatron_loop.model.looplm import build_model

K = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=0, core_layers=2, train_loops=K, coda_layers=0,
                                  vocab_size=640, exit_gate="learned", block_norm="branch_output", loop_norm=True,
                                  recompute="none"))
    looplm = build_model(cfg).eval()
    with torch.no_grad():  # norms away from 1 and a gate that separates tokens
        for name, p in looplm.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.5, 1.5)
        looplm.exit_gate.weight.normal_(0.0, 0.3)
        looplm.exit_gate.bias.fill_(-0.5)
    folder = export_state_dict(looplm.state_dict(), cfg, tmp_path_factory.mktemp("ouro_norms") / "hf")
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert hf.config.loop_norm and hf.config.block_norm == "branch_output" and not hf.config.weighted_exit
    return looplm, hf


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def ouro_reference(hf, x: torch.Tensor, r: int):
    """(per-loop normed states, gate logits, logits at r, expected logits) of Ouro's forward, in float64."""
    m = hf.model.double()
    try:
        eps = hf.config.rms_norm_eps
        positions = torch.arange(x.shape[1])[None].expand_as(x)
        rope = m.rotary_emb(positions, torch.float64)
        h = m.embed_tokens(x).double()
        states, gates = [], []
        for _ in range(r):
            for block in m.core:  # OuroDecoderLayer: residual + Norm_2(attn(Norm_1(h))), then the MLP likewise
                a = block.self_attn(_rms(h, block.input_layernorm.weight, eps), rope, None, None, 0, None)
                h = h + _rms(a, block.attn_output_norm.weight, eps)
                f = block.mlp(_rms(h, block.post_attention_layernorm.weight, eps))
                h = h + _rms(f, block.mlp_output_norm.weight, eps)
            h = _rms(h, m.norm.weight, eps)  # self.norm after every UT step; the next step reads it
            states.append(h)
            gates.append(h @ m.exit_gate.weight.double().T + m.exit_gate.bias.double())
        head = hf.lm_head.weight.double()
        remaining, pdf = torch.ones(x.shape, dtype=torch.float64), []
        for i, g in enumerate(gates):  # Ouro's exit pdf: lambda_i * remaining, the remainder at the last step
            lam = torch.sigmoid(g.squeeze(-1))
            pdf.append(lam * remaining if i < r - 1 else remaining)
            remaining = remaining * (1 - lam)
        expected = sum(p[..., None] * (s @ head.T) for p, s in zip(pdf, states))
        return states, torch.stack(pdf, -1), states[-1] @ head.T, expected
    finally:
        hf.model.float()


def test_norms_and_weighted_exit_match_the_float64_reference_and_the_training_model(models):
    looplm, hf = models
    x = torch.randint(1, 600, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for r in (1, K, 2 * K):
            states, pdf, logits, expected = ouro_reference(hf, x, r)
            theirs = hf(x, num_loops=r, use_cache=False, output_hidden_states=True)
            ours = looplm(x, num_loops=r)
            torch.testing.assert_close(theirs.logits.double(), logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-5, atol=1e-5)
            for got, want in zip(theirs.hidden_states[1:], states):  # every loop's state is Norm(y)
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(theirs.exit_pdf.double(), pdf, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(ours.exit_pdf, theirs.exit_pdf, rtol=1e-5, atol=1e-6)
            weighted = hf(x, num_loops=r, use_cache=False, weighted_exit=True)
            torch.testing.assert_close(weighted.logits.double(), expected, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(looplm(x, num_loops=r, weighted_exit=True).logits, weighted.logits,
                                       rtol=1e-5, atol=1e-5)
            if r > 1:  # the expectation is not any single loop's logits
                assert (weighted.logits - theirs.logits).abs().max() > 1e-3


def test_weighted_exit_decodes_with_the_cache_as_without_and_is_refused_where_it_cannot_run(models):
    from hf_fixtures import greedy_without_cache, left_padded_batch

    from megatron_loop.hf.modeling_looplm import LoopLMConfig

    _, hf = models
    ids, mask = left_padded_batch(0)
    hf.config.weighted_exit = True
    try:
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
        torch.testing.assert_close(out, greedy_without_cache(hf, ids, mask, 4), rtol=0, atol=0)
    finally:
        hf.config.weighted_exit = False
    with pytest.raises(ValueError, match="^weighted_exit=True weighs every loop's logits by the learned exit gate"):
        LoopLMConfig(weighted_exit=True)
    with pytest.raises(ValueError, match="^weighted_exit=True with coda_layers=1: Ouro's expected logits"):
        LoopLMConfig(weighted_exit=True, exit_gate="learned", coda_layers=1)
    with pytest.raises(ValueError, match="^weighted_exit=True with exit_criterion='q_exit': the expected logits"):
        hf(ids, weighted_exit=True, exit_criterion="q_exit", exit_threshold=0.5)


def test_the_parameter_count_includes_the_branch_output_norms(models):
    from megatron_loop.plan import count_parameters

    looplm, _ = models
    plain = build_model_config(dict(backbone="tiny-llama", prelude_layers=0, core_layers=2, train_loops=K,
                                    coda_layers=0, vocab_size=640, exit_gate="learned"))
    blocks = looplm.config.prelude_layers + looplm.config.core_layers + looplm.config.coda_layers
    assert count_parameters(looplm.config).total == looplm.num_parameters() == \
        count_parameters(plain).total + 2 * blocks * looplm.config.hidden_size  # loop_norm: the final norm's weights


def test_in_bf16_the_training_model_and_the_export_agree(models):
    """The precision users run on GPU (bf16 through DeepSpeed): the norms and the weighted exit in bf16, the
    training model against the export, both within bf16's resolution of the float64 reference."""
    import copy

    # a fresh training model with the same weights, not a deepcopy: megatron-core's layers keep the process's
    # tensor-parallel group when an earlier test of this process made one, and a group does not pickle
    looplm = build_model(models[0].config).eval()
    looplm.load_state_dict(models[0].state_dict())
    looplm, hf = looplm.to(torch.bfloat16), copy.deepcopy(models[1]).to(torch.bfloat16)
    x = torch.randint(1, 600, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, _, logits, expected = ouro_reference(copy.deepcopy(models[1]), x, 2 * K)
        for weighted, want in ((False, logits), (True, expected)):
            ours = looplm(x, num_loops=2 * K, weighted_exit=weighted).logits
            theirs = hf(x, num_loops=2 * K, use_cache=False, weighted_exit=weighted).logits
            assert ours.dtype == theirs.dtype == torch.bfloat16
            torch.testing.assert_close(ours, theirs, rtol=0.02, atol=0.02)
            torch.testing.assert_close(theirs.double(), want, rtol=0.05, atol=0.05)
