"""Per-token adaptive exit at inference, in ``LoopLM`` and in the HF export.

Threshold 0 is the fixed model with r = cap (bit for bit) and a huge threshold exits every token
after its first loop; in between, tokens of one sequence run different loop counts, and the
training model and the export (two implementations) agree on every token's count and logits.
Under the "latest" KV policy, cached greedy decoding equals cache-free decoding, batched with left
padding, and the cache slots of the loops a token skipped hold its last computed keys/values.
Exports written before the exit fields existed still load (no exit).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hf_fixtures import MODELS, greedy_without_cache, hf_assets, left_padded_batch
from megatron_loop import LoopConfigError, build_model
from megatron_loop.config import build_model_config
from megatron_loop.hf.modeling_looplm import CACHE_FIELD, exit_distance

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)

CRITERIA = ("kl", "cosine")
HUGE = 1e9
PAD, NEW_TOKENS = 0, 6


def _baseloop():
    torch.manual_seed(0)
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=2, train_loops=3, vocab_size=256,
                                  initial_injection="channel", history_injection="scalar", history_window=2,
                                  recompute="none"))
    return build_model(cfg).eval()


def _mixed_threshold(distances: torch.Tensor, exit_loops) -> float:
    """A threshold at which tokens exit at different loops (``exit_loops(threshold)``), placed in
    the widest possible relative gap between the observed per-token, per-loop distances, so no
    decision sits near it where float rounding (cache vs no cache, training model vs export)
    could flip it."""
    d = distances.flatten().double().sort().values.clamp(min=1e-12)
    gaps = (d[1:] / d[:-1]).argsort(descending=True)
    for i in gaps.tolist():
        threshold = float((d[i] * d[i + 1]).sqrt())
        if len(exit_loops(threshold).unique()) >= 2:
            return threshold
    raise AssertionError("no threshold gives mixed exits")


def _looplm_distances(model, x, r, criterion, **kw) -> torch.Tensor:
    with torch.no_grad():
        states = model(x, num_loops=r, return_trajectory=True, **kw).trajectory
    if criterion == "kl":
        states = [torch.log_softmax(torch.nn.functional.linear(model.norm(h), model.head_weight()), -1) for h in states]
    return torch.stack([exit_distance(criterion, a, b) for a, b in zip(states, states[1:])])


@pytest.mark.parametrize("criterion", CRITERIA)
def test_looplm_threshold_zero_is_fixed_r_and_huge_is_one_loop(criterion):
    model = _baseloop()
    x = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        zero = model(x, num_loops=5, exit_criterion=criterion, exit_threshold=0.0)
        huge = model(x, num_loops=5, exit_criterion=criterion, exit_threshold=HUGE)
        assert torch.equal(zero.logits, model(x, num_loops=5).logits) and bool((zero.exit_loops == 5).all())
        assert torch.equal(huge.logits, model(x, num_loops=1).logits) and bool((huge.exit_loops == 1).all())
        threshold = _mixed_threshold(_looplm_distances(model, x, 5, criterion), lambda t: model(
            x, num_loops=5, exit_criterion=criterion, exit_threshold=t).exit_loops)
        mid = model(x, num_loops=5, exit_criterion=criterion, exit_threshold=threshold)
    assert mid.exit_loops.min() >= 1 and mid.exit_loops.max() <= 5 and len(mid.exit_loops.unique()) >= 2
    with pytest.raises(LoopConfigError, match="exit_threshold=-1"):
        model(x, exit_criterion=criterion, exit_threshold=-1)
    with pytest.raises(LoopConfigError, match="exit_criterion='entropy'"):
        model(x, exit_criterion="entropy", exit_threshold=1.0)


# ---------------------------------------------------------------- the HF export

EXPORTS = ["core_llama_rc_adaln_z3", "core_qwen_scalar_lg", "base_llama"]


@pytest.fixture(scope="module", params=EXPORTS)
def export(request):
    from transformers import AutoModelForCausalLM

    from megatron_loop.export.load import load_looplm_from_hf

    name = request.param
    path = hf_assets().exports[name]
    hf = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    return name, hf, load_looplm_from_hf(path)


def _hf_threshold(hf, ids, mask, r, criterion) -> float:
    with torch.no_grad():
        states = hf(ids, attention_mask=mask, num_loops=r, use_cache=False, output_hidden_states=True).hidden_states
    if criterion == "kl":
        states = [torch.log_softmax(hf.lm_head(hf.model.norm(h)).float(), -1) for h in states]
    d = torch.stack([exit_distance(criterion, a, b) for a, b in zip(states, states[1:])])
    with torch.no_grad():
        return _mixed_threshold(d[:, mask.bool()], lambda t: hf(
            ids, attention_mask=mask, num_loops=r, exit_criterion=criterion, exit_threshold=t,
            use_cache=False).exit_loops[mask.bool()])


@pytest.mark.parametrize("criterion", CRITERIA)
def test_export_agrees_with_the_training_model(export, criterion):
    name, hf, looplm = export
    r = 2 * MODELS[name][1]["train_loops"]
    x = torch.randint(1, 600, (2, 9), generator=torch.Generator().manual_seed(1))
    threshold = _hf_threshold(hf, x, torch.ones_like(x), r, criterion)
    with torch.no_grad():
        ours = looplm(x, num_loops=r, exit_criterion=criterion, exit_threshold=threshold)
        theirs = hf(x, num_loops=r, exit_criterion=criterion, exit_threshold=threshold, use_cache=False)
        fixed = hf(x, num_loops=r, use_cache=False)
        zero = hf(x, num_loops=r, exit_criterion=criterion, exit_threshold=0.0, use_cache=False)
    assert len(theirs.exit_loops.unique()) >= 2  # tokens of one sequence ran different loop counts
    assert torch.equal(ours.exit_loops, theirs.exit_loops)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(zero.logits, fixed.logits) and bool((zero.exit_loops == r).all())


def test_export_huge_threshold_runs_one_loop():
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_assets().exports["base_llama"], trust_remote_code=True).eval()
    x = torch.randint(1, 600, (2, 9))
    with torch.no_grad():
        for criterion in CRITERIA:
            out = hf(x, num_loops=6, exit_criterion=criterion, exit_threshold=HUGE, use_cache=True)
            assert bool((out.exit_loops == 1).all())
            assert torch.equal(out.logits, hf(x, num_loops=1).logits)
            assert len(getattr(out, CACHE_FIELD).layers) == 6 * 2  # every skipped loop still has its cache slots


@pytest.mark.parametrize("criterion", CRITERIA)
def test_cached_decoding_equals_cache_free_under_the_latest_policy(export, criterion):
    name, hf, _ = export
    r = 2 * MODELS[name][1]["train_loops"]
    ids, mask = left_padded_batch(PAD)
    threshold = _hf_threshold(hf, ids, mask, r, criterion)
    hf.config.num_loops, hf.config.exit_criterion, hf.config.exit_threshold = r, criterion, threshold
    try:
        seen = []  # each forward's exit loops: the prompt, then one decoded token per step
        hook = hf.register_forward_hook(lambda module, args, output: seen.append(output.exit_loops))
        try:
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=PAD, eos_token_id=None, return_dict_in_generate=True)
        finally:
            hook.remove()
        generated = out.sequences
        torch.testing.assert_close(generated, greedy_without_cache(hf, ids, mask, NEW_TOKENS), rtol=0, atol=0)
        for b in range(3):  # left padding changes nothing: each prompt alone
            alone = hf.generate(ids[b][mask[b].bool()][None], max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=PAD, eos_token_id=None)
            torch.testing.assert_close(alone[0, -NEW_TOKENS:], generated[b, -NEW_TOKENS:], rtol=0, atol=0)
        # the policy itself: each token's slots of the loops it skipped hold its last computed keys/values
        # (the decode's own counts: a cache-free forward could round a generated token's distance to
        # the other side of the threshold)
        full_mask = torch.cat([mask, torch.ones(3, NEW_TOKENS - 1, dtype=torch.long)], dim=1)
        loops = torch.cat(seen, dim=1)
        assert loops.shape == full_mask.shape and len(loops[full_mask.bool()].unique()) >= 2, loops
        cfg, cache = hf.config, getattr(out, CACHE_FIELD)
        for k in range(cfg.core_layers):
            keys = torch.stack([cache.layers[cfg.prelude_layers + t * cfg.core_layers + k].keys for t in range(r)])
            latest = keys[(loops - 1).clamp(min=0), torch.arange(3)[:, None], :, torch.arange(loops.shape[1])]
            for t in range(r):
                skipped = loops <= t  # [b, s]: loop t was skipped by these tokens
                got = keys[t].permute(0, 2, 1, 3)[skipped]  # [n, heads, head_dim]
                assert torch.equal(got, latest[skipped])
    finally:
        hf.config.num_loops, hf.config.exit_criterion, hf.config.exit_threshold = None, "none", 0.0


def test_exports_without_exit_fields_load_and_bad_fields_are_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    old = tmp_path / "old"
    shutil.copytree(hf_assets().exports["core_qwen_scalar_lg"], old)
    config = json.loads((old / "config.json").read_text())
    assert config["exit_criterion"] == "none" and config["exit_threshold"] == 0.0  # what exports now write
    for key in ("exit_criterion", "exit_threshold"):
        del config[key]
    (old / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(old, trust_remote_code=True).eval()
    assert model.config.exit_criterion == "none" and model.config.exit_threshold == 0.0
    with torch.no_grad():
        assert model(torch.tensor([[5, 6, 7]])).exit_loops is None  # no exit: the fixed-r model
    x = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="exit_criterion='halt'"):
        model(x, exit_criterion="halt")
    with pytest.raises(ValueError, match="exit_threshold=-0.5"):
        model(x, exit_criterion="cosine", exit_threshold=-0.5)
    with pytest.raises(ValueError, match="LM head"):
        model.model(x, exit_criterion="kl", exit_threshold=1.0)
