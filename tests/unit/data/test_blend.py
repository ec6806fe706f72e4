"""Blending: weights respected, deterministic, components read unchanged; config forms."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from data_fixtures import data_assets
from megatron_loop.data.blend import BlendedDataset, blend_index, max_blend_samples
from megatron_loop.config import DataConfig, config_from_dict
from megatron_loop.data.loaders import build_train_valid_loaders
from megatron_loop.data.packed import PackedDataset
from megatron_loop.errors import LoopConfigError, LoopDataError

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


@pytest.mark.parametrize("weights", [(0.7, 0.3), (1, 1, 2), (0.98, 0.01, 0.01), (5, 1, 1, 1, 1, 1)])
def test_blend_counts_track_weights_at_every_prefix(weights):
    n = 5000
    which, local = blend_index(weights, n)
    w = np.asarray(weights, dtype=float) / sum(weights)
    onehot = np.eye(len(w), dtype=np.int64)[which]
    counts = np.cumsum(onehot, axis=0)  # counts[i, k]: samples of k among the first i + 1
    expected = np.arange(1, n + 1)[:, None] * w[None, :]
    assert np.abs(counts - expected).max() <= 2.0  # greedy schedule: within two samples throughout
    # Each component is read in order from its first sample, without gaps or repeats.
    for k in range(len(w)):
        assert local[which == k].tolist() == list(range(int((which == k).sum())))
    again = blend_index(weights, n)
    assert np.array_equal(again[0], which) and np.array_equal(again[1], local)


def test_blend_rejects_bad_weights():
    for bad in ([], [1, -1], [0.5, float("nan")]):
        with pytest.raises(LoopConfigError, match="expected one positive number per prefix"):
            blend_index(bad, 10)


def test_blended_dataset_serves_component_items():
    a = [torch.tensor([0, i]) for i in range(100)]
    b = [torch.tensor([1, i]) for i in range(100)]
    ds = BlendedDataset([a, b], [0.25, 0.75], 80)
    items = [ds[i] for i in range(len(ds))]
    assert sum(int(x[0]) == 0 for x in items) == 20
    assert [int(x[1]) for x in items if int(x[0]) == 1] == list(range(60))
    with pytest.raises(LoopDataError, match="blend needs 60 samples from"):
        BlendedDataset([a, b[:10]], [0.25, 0.75], 80)


@pytest.mark.parametrize("sizes, weights", [([100, 100], [0.25, 0.75]), ([7, 1000, 50], [0.1, 0.1, 0.8])])
def test_max_blend_samples_is_tight(sizes, weights):
    parts = [list(range(n)) for n in sizes]
    n = max_blend_samples(sizes, weights)
    assert len(BlendedDataset(parts, weights, n)) == n
    with pytest.raises(LoopDataError, match="blend needs"):
        BlendedDataset(parts, weights, n + 1)


def test_loaders_one_pass_blend(tmp_path):
    src = data_assets().prefix
    for name in ("a", "b"):
        for suffix in (".bin", ".idx"):
            shutil.copy(src + suffix, tmp_path / f"{name}{suffix}")
    data = DataConfig(train_prefixes=[str(tmp_path / "a"), str(tmp_path / "b")], num_workers=0, order="shuffled")
    loaders = build_train_valid_loaders(data, seq_length=64, global_batch_size=8, micro_batch_size=4, seed=5)
    ds = loaders.train_dataset
    assert len(ds) == max_blend_samples([len(d) for d in ds.datasets], [1, 1]) >= 2 * len(ds.datasets[0]) - 2
    assert all(d.num_epochs == 1 for d in ds.datasets)


def test_loaders_blend_two_prefixes(tmp_path):
    src = data_assets().prefix
    for name in ("a", "b"):
        for suffix in (".bin", ".idx"):
            shutil.copy(src + suffix, tmp_path / f"{name}{suffix}")
    cfg = DataConfig(train_prefixes=[str(tmp_path / "a"), str(tmp_path / "b")], train_weights=[3, 1],
                     num_workers=0, order="shuffled")
    one_pass = len(PackedDataset(src, 64, seed=5))
    samples = 2 * one_pass  # component a (weight 3/4) needs 1.5 passes
    loaders = build_train_valid_loaders(cfg, seq_length=64, global_batch_size=8, micro_batch_size=4,
                                        seed=5, train_samples=samples)
    ds = loaders.train_dataset
    assert isinstance(ds, BlendedDataset) and len(ds) == samples
    share = np.bincount(ds.dataset_index[:samples]) / samples
    np.testing.assert_allclose(share, [0.75, 0.25], atol=1e-3)
    # The two copies get different seeds, so their document orders differ.
    assert not np.array_equal(ds.datasets[0].index.doc_order, ds.datasets[1].index.doc_order)
    # Component a needs 1.5 passes' worth of sequences: more than one pass over the data.
    assert ds.datasets[0].num_epochs > 1 and len(ds.datasets[0]) >= 1.5 * one_pass
    first = next(iter(loaders.train))["tokens"]
    k, j = int(ds.dataset_index[0]), int(ds.dataset_sample_index[0])
    assert torch.equal(first[0], ds.datasets[k][j]["tokens"])


def test_blend_config_forms():
    """What YAML can write for the blend (data.train_prefixes, data.train_weights) is read and checked
    by the config layer; the loader takes DataConfig.train_blend()."""
    def data(**keys):
        return config_from_dict({"data": keys}).data

    assert data(train_prefixes=["p"]).train_blend() == [("p", 1.0)]
    assert data(train_prefixes=["p", "q"]).train_blend() == [("p", 1.0), ("q", 1.0)]
    assert data(train_prefixes=["p", "q"], train_weights=[0.3, 0.7]).train_blend() == [("p", 0.3), ("q", 0.7)]
    assert data(train_prefixes=["p"], train_weights=[2]).train_blend() == [("p", 2.0)]
    assert config_from_dict({"data": {"train_prefixes": ["p"]}}, overrides=[
        "data.train_prefixes=[p, q]", "data.train_weights=[1, 3]"]).data.train_blend() == [("p", 1.0), ("q", 3.0)]
    with pytest.raises(LoopConfigError, match=r"data\.train_prefixes: empty; expected at least one indexed dataset "
                                              r"prefix \(P for P\.bin/P\.idx, written by tools/preprocess_data\.py\)"):
        data().train_blend()
    with pytest.raises(LoopConfigError,
                       match=r"data\.train_weights: expected one weight per train prefix \(2\), got 1"):
        data(train_prefixes=["p", "q"], train_weights=[1.0])
    with pytest.raises(LoopConfigError, match=r"data\.train_weights=\[1\.0, -1\.0\]: expected positive weights"):
        data(train_prefixes=["p", "q"], train_weights=[1.0, -1.0])
    with pytest.raises(LoopConfigError, match=r"data\.train_prefixes='p': expected a list of str"):
        data(train_prefixes="p")
