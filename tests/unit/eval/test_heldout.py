"""``eval/heldout.py``: the held-out loss is the mean over packed windows of each window's mean next-token
cross-entropy, its standard error the sample deviation over windows / sqrt(windows), perplexity exp(loss)
(the sweep that reports it: tests/integration/eval/). Checked against the same numbers computed here from
the packed windows, on a tiny prefix and a one-layer model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron_loop.data.packed import PackedDataset
from megatron_loop.eval.heldout import _mean_loss, heldout_loss

VOCAB, SEQ = 13, 8


class _Bigram(torch.nn.Module):
    """Logits from the current token alone; ``loop_readouts`` gives r-scaled logits per r."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(VOCAB, VOCAB)

    def forward(self, tokens, use_cache=False):
        return SimpleNamespace(logits=self.table(tokens))

    def loop_readouts(self, tokens, loops):
        return {r: self.table(tokens) * r for r in loops}


@pytest.fixture
def prefix(tmp_path) -> str:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(5)
    builder = IndexedDatasetBuilder(str(tmp_path / "p.bin"), dtype=np.uint16)
    for length in (9, 14, 5, 20, 11):
        builder.add_document(torch.from_numpy(rng.integers(0, VOCAB, length).astype(np.int64)), [length])
    builder.finalize(str(tmp_path / "p.idx"))
    return str(tmp_path / "p")


def _window_losses(model, prefix, n, scale=1):
    ds = PackedDataset(prefix, seq_length=SEQ, seed=1234)
    out = []
    with torch.no_grad():
        for i in range(n):
            t = ds[i]["tokens"]
            logits = model.table(t) * scale
            out.append(torch.nn.functional.cross_entropy(logits[:-1].float(), t[1:]).item())
    return out


def test_mean_loss_formula():
    stats = _mean_loss([1.0, 2.0, 4.0])
    assert stats["loss"] == pytest.approx(7 / 3)
    assert stats["stderr"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2 / 3))
    assert stats["perplexity"] == pytest.approx(math.exp(7 / 3))
    assert stats["sequences"] == 3
    assert _mean_loss([0.5])["stderr"] is None  # one window: no spread to estimate


def test_heldout_loss_is_the_mean_over_packed_windows(prefix):
    model = _Bigram()
    windows = len(PackedDataset(prefix, seq_length=SEQ, seed=1234))
    assert windows == 59 // SEQ  # 59 tokens in 8-token windows, the tail dropped
    expected = _mean_loss(_window_losses(model, prefix, windows))
    got = heldout_loss(model, prefix, SEQ, batch_size=3)  # batches that do not divide the windows
    assert got["sequences"] == windows
    for key in ("loss", "stderr", "perplexity"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6)


def test_max_sequences_and_one_pass_readouts_per_r(prefix):
    model = _Bigram()
    capped = heldout_loss(model, prefix, SEQ, max_sequences=4)
    assert capped["sequences"] == 4
    assert capped["loss"] == pytest.approx(_mean_loss(_window_losses(model, prefix, 4))["loss"], rel=1e-6)
    per_r = heldout_loss(model, prefix, SEQ, max_sequences=4, loops=[1, 3])
    assert sorted(per_r) == [1, 3]
    assert per_r[1]["loss"] == pytest.approx(capped["loss"], rel=1e-6)
    assert per_r[3]["loss"] == pytest.approx(_mean_loss(_window_losses(model, prefix, 4, scale=3))["loss"], rel=1e-6)
