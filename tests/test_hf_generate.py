"""KV-cached generate() of the HF LoopLM (issue 6): one cache slot per executed block occurrence,
greedy decoding equal to cache-free step-by-step decoding at r = K and 2K, batched with left
padding, and equal to decoding each prompt alone without padding."""

from __future__ import annotations

import pytest
import torch

from hf_fixtures import MODELS, greedy_without_cache, hf_assets, left_padded_batch

NEW_TOKENS = 6
PAD = 0


@pytest.fixture(scope="module", params=["core_llama_rc_adaln_z3", "core_qwen_scalar_lg", "base_llama_channel_bg"])
def loaded(request):
    from transformers import AutoModelForCausalLM

    name = request.param
    model = AutoModelForCausalLM.from_pretrained(hf_assets().exports[name], trust_remote_code=True).eval()
    return name, model


def _loops(name):
    k = MODELS[name][1]["train_loops"]
    return (k, 2 * k)


def test_cache_has_one_slot_per_executed_block(loaded):
    name, model = loaded
    cfg = model.config
    for r in _loops(name):
        with torch.no_grad():
            out = model(torch.tensor([[5, 6, 7]]), num_loops=r, use_cache=True)
        depth = cfg.prelude_layers + r * cfg.core_layers + cfg.coda_layers
        assert len(out.past_key_values.layers) == depth
        assert out.past_key_values.get_seq_length() == 3


def test_generate_with_cache_equals_cache_free_decoding(loaded):
    name, model = loaded
    ids, mask = left_padded_batch(PAD)
    for r in _loops(name):
        model.config.num_loops = r
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                   pad_token_id=PAD, eos_token_id=None)
        assert generated.shape == (3, 7 + NEW_TOKENS)
        torch.testing.assert_close(generated, greedy_without_cache(model, ids, mask, NEW_TOKENS), rtol=0, atol=0)
        for b in range(3):  # left padding changes nothing: each prompt alone, no padding
            alone = model.generate(ids[b][mask[b].bool()][None], max_new_tokens=NEW_TOKENS, do_sample=False,
                                   pad_token_id=PAD, eos_token_id=None)
            torch.testing.assert_close(alone[0, -NEW_TOKENS:], generated[b, -NEW_TOKENS:], rtol=0, atol=0)
    model.config.num_loops = None


def test_decoding_depends_on_loop_count(loaded):
    """The cache is per occurrence, so r really changes the computation (no stale slots)."""
    name, model = loaded
    ids = torch.tensor([[11, 12, 13, 14]])
    k = MODELS[name][1]["train_loops"]
    with torch.no_grad():
        a = model(ids, num_loops=k).logits
        b = model(ids, num_loops=2 * k).logits
    assert not torch.allclose(a, b)


def test_changing_loops_mid_decoding_is_refused(loaded):
    name, model = loaded
    k = MODELS[name][1]["train_loops"]
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 7]]), num_loops=k, use_cache=True)
        with pytest.raises(ValueError, match="keep num_loops fixed"):
            model(torch.tensor([[8]]), num_loops=2 * k, past_key_values=out.past_key_values, use_cache=True)
