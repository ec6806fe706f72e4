"""The export's Python API on the bad inputs issue 43 found: a loop count the model ran for ever, loop counts
parsed or truncated instead of refused, token ids past the vocabulary, a from_pretrained kwarg that
resizes weights. Each is a ``ValueError`` naming the argument (``hf/modeling_looplm.py``'s ``_checked_call``,
which every forward and every ``generate`` step passes); tests/integration/hf/test_fuzz_export.py fuzzes
the class around them."""

from __future__ import annotations

import re
import time

import pytest
import torch

from fuzz_fixtures import fuzz_assets


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(fuzz_assets().export, trust_remote_code=True).eval()


IDS = torch.tensor([[5, 1, 2]])


def test_a_loop_count_without_end_is_refused_by_the_model_itself(model):
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^num_loops=1000000000: expected at most 1024 \(a forward at r runs "
                                         r"L\(r\) = p \+ r s block applications per token\)$"):
        model(IDS, num_loops=10**9)  # before: never returned
    with pytest.raises(ValueError, match=r"^LoopLMConfig\.num_loops=1000000000: expected at most 1024"):
        AutoModelForCausalLM.from_pretrained(fuzz_assets().export, trust_remote_code=True, num_loops=10**9)
    with pytest.raises(ValueError, match=r"^LoopLMConfig\.num_loops=1025: expected at most 1024"):
        model.config.num_loops = 1025
    assert time.perf_counter() - start < 30
    assert model(IDS, num_loops=1024).logits.shape == (1, 3, 320)  # the bound itself runs


@pytest.mark.parametrize("value", ["3", 2.7, "x", True, 3.0])
def test_loop_counts_are_integers_in_forward_and_generate(model, value):
    pattern = "^" + re.escape(f"num_loops={value!r}: expected an integer >= 1 (the inference loop count r)")
    with pytest.raises(ValueError, match=pattern):
        model(IDS, num_loops=value)  # 2.7 ran 2 loops before
    with pytest.raises(ValueError, match=r"^num_loops="):
        model.generate(IDS, num_loops=value, max_new_tokens=2, do_sample=False)  # '3' ran 3 loops before
    out = model.generate(IDS, num_loops=3, max_new_tokens=3, do_sample=False)  # r != K: an IndexError before
    model.config.num_loops = 3
    try:
        assert torch.equal(out, model.generate(IDS, max_new_tokens=3, do_sample=False))
    finally:
        model.config.num_loops = None


def test_token_ids_beyond_the_vocabulary(model):
    with pytest.raises(ValueError, match=r"^input_ids: token id 5000 is outside the vocabulary \(vocab_size=320\); "
                                         r"expected ids in \[0, 319\]"):
        model(torch.tensor([[5000, 1, 2]]))  # a bare IndexError before (a device-side assert on CUDA)
    with pytest.raises(ValueError, match=r"^input_ids: token id -1 is outside the vocabulary"):
        model.generate(torch.tensor([[-1, 1]]), max_new_tokens=1)
    with pytest.raises(ValueError, match=r"^input_ids: a torch\.float32 tensor of shape \[1, 2\]; expected an "
                                         r"integer tensor of token ids"):
        model(torch.tensor([[1.0, 2.0]]))


def test_a_from_pretrained_kwarg_that_resizes_weights():
    from transformers import AutoModelForCausalLM

    with pytest.raises(RuntimeError, match=r"LoopLM weights do not fit this config: "
                                           r"model\.history_injection\.beta has shape \[2\] in the export, \[5\] for "
                                           r"this config \(history_window=5, hidden_size=32\); expected the config\.json "
                                           r"written with these weights: from_pretrained takes inference settings"):
        AutoModelForCausalLM.from_pretrained(fuzz_assets().export, trust_remote_code=True, history_window=5)
    with pytest.raises(ValueError, match=r"^LoopLMConfig\.hidden_size=-1: expected an integer >= 1$"):
        AutoModelForCausalLM.from_pretrained(fuzz_assets().export, trust_remote_code=True, hidden_size=-1)


def test_the_export_bound_is_the_training_bound():
    """The export's file stands alone (it cannot import the config): its bound is kept equal here."""
    from megatron_loop.config.validation import MAX_LOOPS
    from megatron_loop.hf import modeling_looplm

    assert modeling_looplm.MAX_LOOPS == MAX_LOOPS == 1024
