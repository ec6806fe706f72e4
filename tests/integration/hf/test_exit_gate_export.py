"""Ouro's learned exit gate in the HF export: the export equals the training model (logits and the exit
distribution p(t|x)) at several r, Q-exit makes the same per-token decisions in both, Q-exit's default
(``exit_mode="readout"``) equals Ouro's run-all-then-gather and the freezing exit stays by name, cached decoding
under Q-exit equals cache-free decoding in both modes (freeze: the "latest" KV policy), one-pass readouts
stay bitwise those of per-r forwards, and an export without the gate refuses Q-exit with one line.

One tiny CoreLoop 1+1x3+1 with the gate, exported from its state dict once for the module (no training
run: the gate's weights are drawn so that tokens exit at different loops).
"""

from __future__ import annotations

import pytest
import torch

from hf_fixtures import greedy_without_cache, left_padded_batch
from megatron_loop.config import build_model_config
from megatron_loop.export.convert import export_state_dict
from megatron_loop.model.looplm import build_model

PAD, NEW_TOKENS, CAP = 0, 5, 5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3, coda_layers=1,
                                  vocab_size=640, exit_gate="learned", recompute="none"))
    looplm = build_model(cfg).eval()
    with torch.no_grad():  # a gate that separates tokens (its initialisation puts every lambda near 1/2)
        looplm.exit_gate.weight.normal_(0.0, 0.3)
        looplm.exit_gate.bias.fill_(-0.5)
    folder = export_state_dict(looplm.state_dict(), cfg, tmp_path_factory.mktemp("ouro") / "hf")
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert hf.config.exit_gate == "learned"
    return looplm, hf


def test_export_equals_the_training_model_with_its_exit_distribution(models):
    looplm, hf = models
    x = torch.randint(1, 600, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for r in (1, 3, 6):  # r = 1, K, 2K
            ours, theirs = looplm(x, num_loops=r), hf(x, num_loops=r, use_cache=False)
            torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-5, atol=1e-5)
            assert theirs.exit_pdf.shape == (2, 9, r)
            torch.testing.assert_close(ours.exit_pdf, theirs.exit_pdf, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(theirs.exit_pdf.sum(-1), torch.ones(2, 9))
        for q in (0.3, 0.6, 0.9):
            ours = looplm(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q, exit_mode="freeze")
            theirs = hf(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q, use_cache=False,
                        output_hidden_states=True, exit_mode="freeze")
            assert torch.equal(ours.exit_loops, theirs.exit_loops)
            torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-5, atol=1e-5)
            # by hand, in float64, along the adaptive run's own trajectory (its later states attend to the
            # frozen keys/values of exited tokens): lambda_t of each state, CDF(t) = sum_j lambda_j S_{j-1},
            # the exit at the first t with CDF(t) >= q, the cap otherwise
            lam = torch.stack([torch.sigmoid(hf.model.exit_gate(hf.model.norm(h)).double())
                               for h in theirs.hidden_states[1:]], -1)
            survival = torch.cumprod(torch.cat([torch.ones_like(lam[..., :1]), 1 - lam[..., :-1]], -1), -1)
            reached = (lam * survival).cumsum(-1) >= q
            first = reached.double().argmax(-1) + 1
            assert torch.equal(theirs.exit_loops, torch.where(reached.any(-1), first, CAP))
        assert len(ours.exit_loops.unique()) >= 2 or len(theirs.exit_loops.unique()) >= 2


def ouro_q_exit_logits(hf, x, cap: int, q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, exit loops) of Ouro's Q-exit written from ByteDance's modeling_ouro.py (Ouro-1.4B file,
    OuroForCausalLM.forward lines 749-760 and 792-812), the gate's arithmetic in float64: every loop for every
    token (the fixed model at r = cap), p_i = lambda_i * remaining (the remainder at the last step), exit_steps =
    argmax(cumsum(pdf) >= q) (the last step where never reached), the gathered states read out. Ouro has no
    Coda; here the Coda and the final norm read the gathered states."""
    model = hf.model
    states = hf(x, num_loops=cap, use_cache=False, output_hidden_states=True).hidden_states[1:]
    remaining, pdf = torch.ones(x.shape, dtype=torch.float64), []
    for i, h in enumerate(states):
        lam = torch.sigmoid(model.exit_gate(model.norm(h)).double())
        if i < len(states) - 1:
            pdf.append(lam * remaining)
            remaining = remaining * (1 - lam)
        else:
            pdf.append(remaining)
    mask = torch.cumsum(torch.stack(pdf, 2), 2) >= q
    steps = torch.argmax(mask.double(), 2)
    steps[~mask.any(2)] = cap - 1
    stacked = torch.stack(states, 2)
    chosen = torch.gather(stacked, 2, steps[..., None, None].expand(-1, -1, 1, stacked.shape[-1])).squeeze(2)
    positions = torch.arange(x.shape[1])[None].expand_as(x)
    logits = hf.lm_head(model._coda(chosen, model.rotary_emb(positions, chosen.dtype), None, None, cap))
    return logits, steps + 1


def test_q_exit_is_ouros_every_loop_for_every_token_then_the_per_token_readout(models):
    """The default exit mode of Q-exit (``readout``) equals Ouro's run-all-then-gather in the export and in the
    training model; the freezing exit, still there by name (``exit_mode="freeze"``), is another model: its exits
    change the other tokens' states, so its logits differ from Ouro's."""
    looplm, hf = models
    assert hf.config.exit_mode is None  # the criterion's own: readout for q_exit
    x = torch.randint(1, 600, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for q in (0.3, 0.6, 0.9):
            want, steps = ouro_q_exit_logits(hf, x, CAP, q)
            theirs = hf(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q, use_cache=False)
            ours = looplm(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q)
            assert torch.equal(theirs.exit_loops, steps) and torch.equal(ours.exit_loops, steps)
            torch.testing.assert_close(theirs.logits, want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ours.logits, want, rtol=1e-5, atol=1e-5)
            frozen = hf(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q, exit_mode="freeze",
                        use_cache=False)
            frozen_ours = looplm(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=q, exit_mode="freeze")
            assert torch.equal(frozen.exit_loops, frozen_ours.exit_loops)
            torch.testing.assert_close(frozen.logits, frozen_ours.logits, rtol=1e-5, atol=1e-5)
            if q == 0.6:
                assert len(steps.unique()) >= 2  # tokens exit at different loops
                assert (frozen.logits - want).abs().max() > 1e-3  # freezing changes the other tokens' logits


def test_q_exit_readout_in_bf16_is_ouros_gather(models):
    """In bf16 (what DeepSpeed runs on GPU) the readout is still the gather of the fixed model's bf16 states."""
    import copy

    hf = copy.deepcopy(models[1]).to(torch.bfloat16)
    x = torch.randint(1, 600, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, steps = ouro_q_exit_logits(hf, x, CAP, 0.6)
        out = hf(x, num_loops=CAP, exit_criterion="q_exit", exit_threshold=0.6, use_cache=False)
    assert out.logits.dtype == torch.bfloat16 and len(steps.unique()) >= 2
    assert torch.equal(out.exit_loops, steps) and torch.equal(out.logits, want)


@pytest.mark.parametrize("mode", ["readout", "freeze"])
def test_cached_q_exit_decoding_equals_cache_free_and_one_pass_readouts_are_exact(models, mode):
    _, hf = models
    ids, mask = left_padded_batch(PAD)
    hf.config.num_loops, hf.config.exit_criterion, hf.config.exit_threshold = CAP, "q_exit", 0.6
    hf.config.exit_mode = mode
    try:
        seen = []
        hook = hf.register_forward_hook(lambda module, args, output: seen.append(output.exit_loops))
        try:
            with torch.no_grad():
                out = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=PAD, eos_token_id=None)
        finally:
            hook.remove()
        assert len(torch.cat(seen, dim=1).unique()) >= 2  # tokens ran different loop counts
        torch.testing.assert_close(out, greedy_without_cache(hf, ids, mask, NEW_TOKENS), rtol=0, atol=0)
    finally:
        hf.config.num_loops, hf.config.exit_criterion, hf.config.exit_threshold = None, "none", 0.0
        hf.config.exit_mode = None
    x = torch.randint(1, 600, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for criterion, q in (("none", 0.0), ("q_exit", 0.6)):
            read = hf.loop_readouts(x, range(1, CAP + 1), exit_criterion=criterion, exit_threshold=q, exit_mode=mode)
            for r in range(1, CAP + 1):
                alone = hf(x, num_loops=r, exit_criterion=criterion, exit_threshold=q, exit_mode=mode,
                           use_cache=False).logits
                assert torch.equal(read[r], alone), (criterion, r)


def test_q_exit_needs_the_gate_and_a_probability():
    from megatron_loop.hf.modeling_looplm import LoopLMConfig

    assert LoopLMConfig().exit_gate == "none"  # exports written before the gate existed
    with pytest.raises(ValueError, match="^exit_criterion='q_exit' exits on the learned exit gate's cumulative"):
        LoopLMConfig(exit_criterion="q_exit", exit_threshold=0.5)
    with pytest.raises(ValueError, match=r"^exit_threshold=2 with exit_criterion='q_exit': expected q in \[0, 1\]"):
        LoopLMConfig(exit_gate="learned", exit_criterion="q_exit", exit_threshold=2)
    with pytest.raises(ValueError, match=r"^LoopLMConfig.exit_gate='ouro': expected one of \('none', 'learned'\)"):
        LoopLMConfig(exit_gate="ouro")


def test_eval_loops_sweeps_q_exit_thresholds(models, tmp_path):
    """``tools/eval_loops.py --exit-criterion q_exit``: q = 0 exits every token after one loop (the fixed model
    at r = 1, exactly: the gate reads no timestep) and q = 1 never before the cap (the fixed r = cap)."""
    import importlib.util
    import json

    from data_fixtures import REPO, data_assets

    looplm, _ = models
    folder = export_state_dict(looplm.state_dict(), looplm.config, tmp_path / "hf",
                               tokenizer=str(data_assets().tokenizer))
    spec = importlib.util.spec_from_file_location("eval_loops_tool", REPO / "tools" / "eval_loops.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--model", str(folder), "--loops", "1,3", "--tasks", "none", "--valid-prefix",
                      data_assets().prefix + "_valid", "--seq-length", "32", "--valid-sequences", "4",
                      "--batch-size", "4", "--output", str(tmp_path / "eval"), "--no-progress",
                      "--exit-criterion", "q_exit", "--exit-thresholds", "0,1"]) == 0
    res = json.loads((tmp_path / "eval" / "results.json").read_text())
    rows = res["adaptive"]["by_threshold"]
    assert res["adaptive"]["criterion"] == "q_exit" and res["adaptive"]["max_loops"] == 3
    assert res["adaptive"]["exit_mode"] == "readout"  # Ouro's, the export's default for q_exit
    assert rows["0"]["loops_per_token"] == 1.0 and rows["0"]["heldout"] == res["heldout"]["1"]
    assert rows["1"]["loops_per_token"] == 3.0 and rows["1"]["heldout"] == res["heldout"]["3"]
    # the learned depth distribution: the mean p(t|x) at r = 3 over the same held-out windows
    from megatron_loop.data.packed import PackedDataset

    windows = PackedDataset(data_assets().prefix + "_valid", seq_length=32, seed=1234)
    tokens = torch.stack([windows[i]["tokens"] for i in range(min(4, len(windows)))])
    with torch.no_grad():
        pdf = looplm(tokens, num_loops=3).exit_pdf.double().reshape(-1, 3)
    depth = res["adaptive"]["exit_distribution"]
    assert depth["tokens"] == pdf.shape[0] and depth["loops"] == 3
    torch.testing.assert_close(torch.tensor(depth["mean_pdf"], dtype=torch.float64), pdf.mean(0), rtol=1e-5, atol=1e-6)
    assert depth["expected_loop"] == pytest.approx(float((pdf.mean(0) * torch.arange(1, 4)).sum()), rel=1e-5)
