"""``megatron_loop/eval/paired.py``: lm-eval's multiple-choice scoring done item by item (the
paired study's items.json), checked against lm-eval's own request split and a hand computation."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_loop.eval import paired


class CharTokenizer:
    """One token per character (id = code point); ``add_special_tokens`` is ignored (none)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


class BigramModel:
    """A causal 'model' whose next-token logits depend on the current token only (a fixed table):
    its log-likelihoods can be computed by hand, and padding after a sequence cannot change them."""

    def __init__(self, vocab: int = 128, seed: int = 0):
        import torch

        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))
        self.calls = 0

    def parameters(self):
        yield self.table

    def __call__(self, ids, use_cache=False):
        import types

        self.calls += 1
        return types.SimpleNamespace(logits=self.table[ids])


def _by_hand(model, ctx: list[int], cont: list[int]) -> float:
    import torch

    seq = ctx + cont
    logprobs = torch.log_softmax(model.table, dim=-1)
    return float(sum(logprobs[seq[i - 1], seq[i]] for i in range(len(ctx), len(seq))))


def test_scoring_follows_lm_eval():
    """Requests are split as lm-eval's ``_encode_pair`` splits them, log-likelihoods are the summed
    log-probabilities of the continuation (batched and padded or not, one forward per distinct input),
    acc / acc_norm pick as lm-eval's ``process_results`` does."""
    from lm_eval.api.model import TemplateLM

    tok = CharTokenizer()

    class Stub:
        backend = "causal"
        tok_encode = staticmethod(lambda s, **_: tok.encode(s))

    for context, continuation in (("Answer:", " 7"), ("Answer: ", "7"), ("Nora grew up in", " Oslo")):
        assert paired.encode_pair(tok, context, continuation) == TemplateLM._encode_pair(Stub(), context, continuation)
    model = BigramModel()
    docs = [{"query": "Given: k = 3.\nQuestion: What is k?\nAnswer:", "choices": list("0123456789"), "gold": 3},
            {"query": "Nora grew up in", "choices": ["Oslo", "Lyon", "Porto", "Bergen"], "gold": 0},
            {"query": "Nora", "choices": ["ab", "abcd"], "gold": 1}]
    requests = [paired.encode_pair(tok, d["query"], " " + c) for d in docs for c in d["choices"]]
    lls = paired.loglikelihoods(model, requests, batch_size=3)
    assert lls == pytest.approx([_by_hand(model, *r) for r in requests], abs=1e-4)
    assert paired.loglikelihoods(model, requests, batch_size=1) == pytest.approx(lls, abs=1e-4)
    model.calls = 0
    paired.loglikelihoods(model, requests[:10], batch_size=64)
    assert model.calls == 1  # the ten one-token answers of one query share one input
    for doc_lls, choices in (([-3.0, -5.0], ["ab", "abcd"]), ([-9.0, -10.0], ["a", "abcdefgh"])):
        assert paired.choose(doc_lls, choices, "acc") == int(np.argmax(doc_lls))
        normalised = np.array(doc_lls) / [len(c) for c in choices]
        assert paired.choose(doc_lls, choices, "acc_norm") == int(np.argmax(normalised))
    assert paired.choose([-9.0, -10.0], ["a", "abcdefgh"], "acc_norm") == 1  # length-normalised flips it
    spans = [(0, 10), (10, 14), (14, 16)]
    expected = [int(paired.choose(lls[a:b], d["choices"], m) == d["gold"])
                for d, (a, b), m in zip(docs, spans, ("acc", "acc_norm", "acc_norm"))]
    assert [paired.score_docs(model, tok, [d], m)[0] for d, m in zip(docs, ("acc", "acc_norm", "acc_norm"))] == expected
