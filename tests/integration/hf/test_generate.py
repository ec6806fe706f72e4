"""KV-cached generate() of the HF LoopLM: one cache slot per executed block occurrence, greedy
decoding equal to cache-free step-by-step decoding at r = K and 2K, batched with left padding,
equal to decoding each prompt alone without padding, and, token for token, to a step-by-step
argmax decode with the training model (``LoopLM``) at the same r."""

from __future__ import annotations

import pytest
import torch

from hf_fixtures import MODELS, greedy_without_cache, hf_assets, left_padded_batch
from megatron_loop.hf.modeling_looplm import CACHE_FIELD

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)

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
        cache = getattr(out, CACHE_FIELD)  # past_key_values up to transformers 5.23, cache from 5.24
        assert len(cache.layers) == depth
        assert cache.get_seq_length() == 3


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


def test_cached_generation_follows_the_training_model_at_each_loop_count(loaded):
    """generate() with the KV cache at r = K and 2K picks, at every step, the argmax of the
    training LoopLM (the same weights, read back from the export) rerun on the whole sequence at
    that r, and its step logits equal the LoopLM's. A cache holding slots of another r, or a
    num_loops the cached path ignores, fails at 2K: the LoopLM's logits at K and 2K differ by far
    more than the tolerance."""
    from megatron_loop.export.load import load_looplm_from_hf

    name, model = loaded
    native = load_looplm_from_hf(hf_assets().exports[name])
    prompt = torch.tensor([[11, 12, 13, 14]])
    for r in _loops(name):
        model.config.num_loops = r
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=PAD, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
        sequence = out.sequences
        with torch.no_grad():
            reference = native(sequence, num_loops=r).logits[0, prompt.shape[1] - 1:-1]
        cached = torch.cat(out.logits)
        torch.testing.assert_close(cached, reference, rtol=1e-4, atol=1e-4)
        assert torch.equal(sequence[0, prompt.shape[1]:], reference.argmax(-1)), (name, r)
    model.config.num_loops = None
    with torch.no_grad():
        at_k, at_2k = (native(prompt, num_loops=r).logits for r in _loops(name))
    assert (at_k - at_2k).abs().max() > 1e-2  # far above the tolerance: running K loops for 2K would fail above


def test_changing_loops_mid_decoding_is_refused(loaded):
    name, model = loaded
    k = MODELS[name][1]["train_loops"]
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 7]]), num_loops=k, use_cache=True)
        with pytest.raises(ValueError, match="keep num_loops fixed"):
            model(torch.tensor([[8]]), num_loops=2 * k, past_key_values=getattr(out, CACHE_FIELD), use_cache=True)


def test_a_cache_under_either_name_is_read_and_an_unknown_name_is_refused(loaded):
    """transformers <= 5.23 passes the cache as ``past_key_values``, >= 5.24 as ``cache``: both are
    read (the next token's logits equal the cache-free ones); a Cache under any other name would be
    silently dropped by ``**kwargs``, so it is refused."""
    from transformers.cache_utils import DynamicCache

    name, model = loaded
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        full = model(ids, use_cache=False).logits[:, -1]
        for key in ("past_key_values", "cache"):
            prefix = model(ids[:, :3], use_cache=True)
            step = model(ids[:, 3:], use_cache=True, **{key: getattr(prefix, CACHE_FIELD)}).logits[:, -1]
            torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
        with pytest.raises(TypeError, match="'kv_cache'"):
            model(ids[:, 3:], use_cache=True, kv_cache=DynamicCache())


def test_lm_eval_generation_equals_cache_free_greedy_decoding(tmp_path):
    """A generative lm-eval task (``generate_until``, batches of prompts of different lengths, left
    padded by lm-eval) through the ``hf`` backend, which decodes with the KV cache, gives, prompt by
    prompt, the text of greedy decoding that reruns the whole sequence at each step without a cache."""
    import json

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = "core_qwen_scalar_lg"
    export = hf_assets().exports[name]
    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True, num_loops=2 * MODELS[name][1]
                                                 ["train_loops"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    questions = ["Alice was born in", "The capital of the country where Bob lives is", "Q: Who is Carol?",
                 "Dan", "In the year of the long winter, Eve moved to the city of", "Frank's mother is"]
    data = tmp_path / "gen.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "x"}) + "\n" for q in questions))
    max_new = 8
    (tmp_path / "gen.yaml").write_text(f"""task: looplm_generation_check
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n\\n"]
  max_gen_toks: {max_new}
  do_sample: false
metric_list:
  - metric: exact_match
""")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=3)
    out = lm_eval.simple_evaluate(model=lm, tasks=["looplm_generation_check"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False))
    samples = out["samples"]["looplm_generation_check"]
    assert len(samples) == len(questions)
    for sample in samples:
        prompt, answer = sample["arguments"][0][0], sample["resps"][0][0]
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        decoded = greedy_without_cache(model, ids, torch.ones_like(ids), max_new)
        expected = tokenizer.decode(decoded[0, ids.shape[1]:]).split("\n\n\n")[0]
        assert answer == expected, (prompt, answer, expected)


@pytest.mark.parametrize("name", ["core_qwen_scalar_lg", "nonloop_llama"])  # LoopLM code and native Llama
def test_batched_generate_with_the_exported_tokenizer_equals_one_by_one(name):
    """The export's tokenizer pads on the left (a decoder continues each prompt from its own last
    token), pads with EOS, and caps ``model_max_length`` at the model's positions, not the training length
    (a longer prompt runs, without the tokenizer's false "indexing errors" warning): greedy
    ``generate`` over a batch of prompts of different lengths, padded by that tokenizer, gives each
    prompt exactly the tokens it gets alone (with right padding the shorter prompts would be
    continued after their pad tokens)."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = hf_assets().exports[name]
    tokenizer = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    config = json.loads((export / "config.json").read_text())
    assert (tokenizer.padding_side, tokenizer.model_max_length) == ("left", config["max_position_embeddings"])
    assert config["train_seq_length"] < config["max_position_embeddings"]
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None
    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    prompts = ["The cat is", "Alice was born in the city of", "Q: Who is Carol? A: Carol is the"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    lengths = batch["attention_mask"].sum(1).tolist()
    assert len(set(lengths)) == 3 and batch["attention_mask"][:, -1].all()  # padded on the left
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    batched = model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1]:]
    for b, prompt in enumerate(prompts):
        alone = tokenizer(prompt, return_tensors="pt")
        assert alone["input_ids"].shape[1] == lengths[b]
        one = model.generate(**alone, **kwargs)[0, lengths[b]:]
        assert batched[b].tolist() == one.tolist(), (name, prompt)
        assert tokenizer.decode(batched[b]) == tokenizer.decode(one)
