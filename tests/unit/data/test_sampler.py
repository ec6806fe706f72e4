"""Distributed sampling and exact resume, at the index level and through the real loaders."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch

from data_fixtures import data_assets
from megatron_loop.config import DataConfig
from megatron_loop.data.loaders import build_train_valid_loaders, measure_loader_throughput
from megatron_loop.data.sampler import GlobalBatchSampler
from megatron_loop.errors import LoopConfigError, LoopDataError

SEQ, GLOBAL, MICRO = 64, 8, 2


@pytest.fixture
def prefix(tmp_path) -> str:
    src = data_assets().prefix
    for suffix in (".bin", ".idx"):
        shutil.copy(src + suffix, tmp_path / f"p{suffix}")
        shutil.copy(src + "_valid" + suffix, tmp_path / f"p_valid{suffix}")
    return str(tmp_path / "p")


def _global_batches(samplers: list[GlobalBatchSampler]) -> list[list[int]]:
    """Reassemble global batches: each rank contributes accumulation_steps micro-batches per step."""
    iters = [iter(s) for s in samplers]
    steps = len(samplers[0]) // samplers[0].accumulation_steps
    out = []
    for _ in range(steps):
        batch = []
        for it, s in zip(iters, samplers):
            for _ in range(s.accumulation_steps):
                batch += next(it)
        out.append(batch)
    return out


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_same_global_batches_for_any_rank_count(dp):
    micro = 2 if dp < 4 else 1
    samplers = [GlobalBatchSampler(100, GLOBAL, micro, r, dp) for r in range(dp)]
    assert samplers[0].accumulation_steps * micro * dp == GLOBAL
    batches = _global_batches(samplers)
    assert batches == [list(range(g * GLOBAL, (g + 1) * GLOBAL)) for g in range(100 // GLOBAL)]
    # Ranks read disjoint parts of every global batch.
    per_rank = [set(sum(list(s), [])) for s in samplers]
    assert sum(map(len, per_rank)) == len(set().union(*per_rank)) == (100 // GLOBAL) * GLOBAL


def test_resume_index_level():
    full = list(GlobalBatchSampler(64, GLOBAL, MICRO, 1, 2))
    resumed = list(GlobalBatchSampler(64, GLOBAL, MICRO, 1, 2, consumed_samples=3 * GLOBAL))
    steps_done = 3 * GLOBAL // (MICRO * 2)
    assert resumed == full[steps_done:]
    assert len(GlobalBatchSampler(64, GLOBAL, MICRO, 1, 2, consumed_samples=3 * GLOBAL)) == len(resumed)
    late = GlobalBatchSampler(64, GLOBAL, MICRO, 1, 2)
    late.consumed_samples = 3 * GLOBAL  # what the training loop does after loading a checkpoint
    assert list(late) == resumed
    with pytest.raises(LoopConfigError, match="consumed_samples 3: expected a non-negative multiple"):
        late.consumed_samples = 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch_size=6, micro_batch_size=4, dp_size=1), "not a multiple of micro_batch_size 4"),
    (dict(global_batch_size=8, micro_batch_size=2, dp_size=2, dp_rank=2), "expected 0 <= rank < 2"),
    (dict(global_batch_size=8, micro_batch_size=2, consumed_samples=5), "consumed_samples 5"),
])
def test_sampler_rejects_inconsistent_sizes(kwargs, message):
    with pytest.raises(LoopConfigError, match=message):
        GlobalBatchSampler(100, **kwargs)


def _data(prefix: str, **keys) -> DataConfig:
    """The typed ``data:`` section over ``prefix``: in-process loading, a shuffled document order."""
    return DataConfig(**{"train_prefixes": [prefix], "num_workers": 0, "order": "shuffled", **keys})


def _loader_batches(prefix, dp_rank, dp_size, consumed=0, train_samples=None):
    loaders = build_train_valid_loaders(_data(prefix), seq_length=SEQ,
                                        global_batch_size=GLOBAL, micro_batch_size=MICRO,
                                        dp_rank=dp_rank, dp_size=dp_size, seed=11,
                                        consumed_samples=consumed, vocab_size=600,
                                        train_samples=train_samples)
    return loaders, [b["tokens"] for b in loaders.train]


def _as_global(per_rank: list[list[torch.Tensor]], accumulation: int) -> list[torch.Tensor]:
    steps = len(per_rank[0]) // accumulation
    return [torch.cat([b for r in per_rank for b in r[s * accumulation:(s + 1) * accumulation]])
            for s in range(steps)]


def test_loaders_same_global_batches_for_one_and_two_ranks(prefix):
    one, b1 = _loader_batches(prefix, 0, 1)
    two = [_loader_batches(prefix, r, 2) for r in range(2)]
    g1 = _as_global([b1], one.train_sampler.accumulation_steps)
    g2 = _as_global([b for _, b in two], two[0][0].train_sampler.accumulation_steps)
    assert len(g1) == len(g2) == len(one.train_dataset) // GLOBAL
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    # Rank slices are disjoint sample indices of the same global batch.
    assert not torch.equal(two[0][1][0], two[1][1][0])


def test_loader_resume_matches_uninterrupted(prefix):
    _, full = _loader_batches(prefix, 1, 2, train_samples=20 * GLOBAL)
    loaders, resumed = _loader_batches(prefix, 1, 2, consumed=7 * GLOBAL, train_samples=20 * GLOBAL)
    acc = loaders.train_sampler.accumulation_steps
    assert len(full) == 20 * acc and len(resumed) == 13 * acc
    for a, b in zip(full[7 * acc:], resumed):
        assert torch.equal(a, b)


def test_loader_batch_fields_and_validation(prefix):
    loaders = build_train_valid_loaders(_data(prefix), seq_length=SEQ, global_batch_size=GLOBAL,
                                        micro_batch_size=MICRO, seed=0)
    batch = next(iter(loaders.train))
    assert set(batch) == {"tokens"}  # the model shifts the labels itself
    assert batch["tokens"].shape == (MICRO, SEQ) and batch["tokens"].dtype == torch.int64
    # Validation defaults to the _valid prefix written by --validation-documents.
    assert loaders.valid is not None and loaders.valid_dataset.prefix == prefix + "_valid"
    valid = [b["tokens"] for b in loaders.valid]
    assert sum(len(v) for v in valid) == len(loaders.valid_dataset) // MICRO * MICRO


def test_loader_takes_the_typed_data_section_and_honours_each_key(prefix, tmp_path):
    """``build_train_valid_loaders`` reads the ``DataConfig`` itself: train_prefixes and
    train_weights (the blend), valid_prefixes (null: the sibling; []: none; else these), num_workers,
    order; ``validation=False`` opens no validation data at all (train.eval_interval 0)."""
    from megatron_loop.data.blend import BlendedDataset
    from probe_fixtures import write_prefix

    def build(data: DataConfig, validation: bool = True, train_samples: int | None = None):
        return build_train_valid_loaders(data, seq_length=SEQ, global_batch_size=GLOBAL, micro_batch_size=MICRO,
                                         validation=validation, seed=3, train_samples=train_samples)

    other = str(tmp_path / "q")
    for suffix in (".bin", ".idx"):
        shutil.copy(prefix + suffix, other + suffix)
    # train_prefixes + train_weights: a blend in those proportions, seeds 3 and 4 (shuffled order)
    blend = build(_data(prefix, train_prefixes=[prefix, other], train_weights=[1.0, 3.0]), train_samples=400)
    ds = blend.train_dataset
    assert isinstance(ds, BlendedDataset) and [d.prefix for d in ds.datasets] == [prefix, other]
    np.testing.assert_allclose(np.bincount(ds.dataset_index) / 400, [0.25, 0.75], atol=1e-2)
    assert [d.seed for d in ds.datasets] == [3, 4] and {d.order for d in ds.datasets} == {"shuffled"}
    assert [u["weight"] for u in blend.train_usage] == [1.0, 3.0]
    # train_weights null: equal weights
    equal = build(_data(prefix, train_prefixes=[prefix, other]), train_samples=400).train_dataset
    np.testing.assert_allclose(np.bincount(equal.dataset_index) / 400, [0.5, 0.5], atol=1e-2)
    # order: stream keeps the documents in the order preprocessing wrote them
    stream = build(_data(prefix, order="stream")).train_dataset
    assert stream.order == "stream"
    assert stream.index.doc_order.tolist() == list(range(len(stream.index.doc_order)))
    # num_workers reaches both loaders
    workers = build(_data(prefix, num_workers=2))
    assert workers.train.num_workers == workers.valid.num_workers == 2
    # valid_prefixes: null is the sibling P_valid, explicit prefixes are read as given, [] is none
    sibling = build(_data(prefix))
    assert sibling.valid_prefixes == [prefix + "_valid"] and sibling.valid_dataset.prefix == prefix + "_valid"
    explicit = build(_data(prefix, valid_prefixes=[other]))
    assert explicit.valid_prefixes == [other] and explicit.valid_dataset.prefix == other
    none = build(_data(prefix, valid_prefixes=[]))
    assert none.valid is None and none.valid_dataset is None and none.valid_prefixes == []
    # validation=False: not even a validation set smaller than a micro-batch is opened
    tiny = write_prefix(tmp_path, num_docs=2, vocab=600)
    off = build(_data(prefix, valid_prefixes=[tiny]), validation=False)
    assert off.valid is None and off.valid_prefixes == []
    assert build(_data(prefix), validation=False).valid is None  # the sibling is not opened either
    with pytest.raises(LoopDataError, match=rf"data\.valid_prefixes \['{re.escape(tiny)}'\]: \d+ sequences of "
                                            rf"seq_length {SEQ}; expected at least micro_batch_size x data-parallel "
                                            rf"size = {MICRO} for validation \(or train without it"):
        build(_data(prefix, valid_prefixes=[tiny]))


def test_train_samples_beyond_one_epoch(prefix):
    loaders, batches = _loader_batches(prefix, 0, 1, train_samples=3000)
    assert loaders.train_dataset.num_epochs > 1
    assert sum(len(b) for b in batches) == 3000 // GLOBAL * GLOBAL


def test_loader_checks_vocab_and_size(prefix):
    with pytest.raises(LoopDataError, match=rf"{prefix}.bin: token id \d+ is not below the model's vocab_size 10"):
        build_train_valid_loaders(_data(prefix), seq_length=SEQ, global_batch_size=GLOBAL,
                                  micro_batch_size=MICRO, vocab_size=10)
    with pytest.raises(LoopDataError, match="expected at least one global batch"):
        build_train_valid_loaders(_data(prefix), seq_length=SEQ, global_batch_size=4096,
                                  micro_batch_size=MICRO)
    with pytest.raises(LoopConfigError, match=r"data\.train_prefixes: empty; expected at least one indexed"):
        build_train_valid_loaders(DataConfig(), seq_length=SEQ, global_batch_size=GLOBAL, micro_batch_size=MICRO)
    with pytest.raises(TypeError, match="expected the config's DataConfig"):  # the untyped dict of old
        build_train_valid_loaders({"train": prefix}, seq_length=SEQ, global_batch_size=GLOBAL,
                                  micro_batch_size=MICRO)


def test_measure_loader_throughput(prefix):
    m = measure_loader_throughput(prefix, seq_length=SEQ, micro_batch_size=4, num_batches=20)
    assert m["batches"] == 20 and m["samples_per_s"] > 0
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * SEQ)
    assert np.isfinite(m["index_build_s"])
