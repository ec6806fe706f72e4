"""Packing: count, stream reconstruction, no overlap, dropped tail, caching, epochs, speed."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from data_fixtures import copy_prefix, data_assets, write_jsonl
from megatron_loop.data.packed import PackedDataset, build_pack_index, epochs_for
from megatron_loop.errors import LoopConfigError, LoopDataError

SEQ = 128


@pytest.fixture
def prefix(tmp_path) -> str:
    return copy_prefix(tmp_path)


def _documents(ds: PackedDataset) -> list[np.ndarray]:
    return [np.array(ds.indexed[i], dtype=np.int64) for i in range(ds.num_documents)]


def _stream(ds: PackedDataset) -> np.ndarray:
    """The shuffled token stream rebuilt from the documents, independently of the sample index."""
    docs = _documents(ds)
    return np.concatenate([docs[j] for j in ds.index.doc_order])


def test_packing_reproduces_shuffled_stream(prefix):
    ds = PackedDataset(prefix, SEQ, seed=3)
    total = ds.tokens_per_epoch
    assert len(ds) == total // SEQ
    assert sorted(ds.index.doc_order.tolist()) == list(range(ds.num_documents))
    assert ds.index.doc_order.tolist() != list(range(ds.num_documents))  # actually shuffled
    samples = [ds[i]["tokens"].numpy() for i in range(len(ds))]
    assert all(s.shape == (SEQ,) and s.dtype == np.int64 for s in samples)
    stream = _stream(ds)
    # Concatenation in order is exactly the stream prefix: consecutive, non-overlapping windows.
    np.testing.assert_array_equal(np.concatenate(samples), stream[: len(ds) * SEQ])
    # The dropped tail is shorter than one sequence.
    assert 0 <= total - len(ds) * SEQ < SEQ
    with pytest.raises(IndexError):
        ds.get_tokens(len(ds))


def test_order_is_determined_by_seed(prefix):
    a, b, c = (PackedDataset(prefix, SEQ, seed=s) for s in (1, 1, 2))
    assert np.array_equal(a.index.doc_order, b.index.doc_order)
    assert not np.array_equal(a.index.doc_order, c.index.doc_order)
    assert np.array_equal(a.get_tokens(5), b.get_tokens(5))


def test_index_is_cached_and_reused(prefix, tmp_path):
    first = PackedDataset(prefix, SEQ, seed=0)
    assert not first.cache_hit
    cached = sorted(p.name for p in tmp_path.glob("p.pack-*.npy"))
    assert len(cached) == 3
    second = PackedDataset(prefix, SEQ, seed=0)
    assert second.cache_hit
    assert isinstance(second.index.sample_doc, np.memmap)
    np.testing.assert_array_equal(first.get_tokens(7), second.get_tokens(7))
    other = PackedDataset(prefix, SEQ + 1, seed=0)
    assert not other.cache_hit
    assert len(list(tmp_path.glob("p.pack-*.npy"))) == 6


def test_cache_invalidated_when_documents_change(prefix, tmp_path):
    from megatron_loop.data.preprocess import PreprocessOptions, preprocess

    first = PackedDataset(prefix, SEQ, seed=0)
    # Same documents in another order: same counts, different lengths sequence.
    docs = data_assets().documents
    src = tmp_path / "swapped.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[50:][::-1]))
    preprocess(str(src), str(data_assets().tokenizer), prefix, PreprocessOptions(progress=False))
    second = PackedDataset(prefix, SEQ, seed=0)
    assert second.num_documents == first.num_documents and second.tokens_per_epoch == first.tokens_per_epoch
    assert not second.cache_hit
    np.testing.assert_array_equal(np.concatenate([second.get_tokens(i) for i in range(len(second))]),
                                  _stream(second)[: len(second) * SEQ])


def test_cache_dir_option(prefix, tmp_path):
    ds = PackedDataset(prefix, SEQ, seed=0, cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 3
    assert PackedDataset(prefix, SEQ, seed=0, cache_dir=str(tmp_path / "cache")).cache_hit
    assert len(ds) > 0


def test_epochs_concatenate_independent_shuffles(prefix):
    one = PackedDataset(prefix, SEQ, seed=4)
    two = PackedDataset(prefix, SEQ, seed=4, num_epochs=2)
    n = one.num_documents
    assert len(two) == 2 * one.tokens_per_epoch // SEQ
    order = two.index.doc_order
    assert np.array_equal(order[:n], one.index.doc_order)
    assert sorted(order[n:].tolist()) == list(range(n)) and not np.array_equal(order[n:], order[:n])
    np.testing.assert_array_equal(np.concatenate([two.get_tokens(i) for i in range(len(two))]),
                                  _stream(two)[: len(two) * SEQ])
    assert epochs_for(one.tokens_per_epoch, SEQ, len(one)) == 1
    assert epochs_for(one.tokens_per_epoch, SEQ, len(one) + 1) == 2


def test_stream_order_packs_the_preprocessing_stream(tmp_path, monkeypatch):
    """``data.order: stream`` packs documents exactly as preprocessing streamed them (App. C.1:
    streaming, shuffle buffer, seed 42; here buffer 10 over a local folder that ``datasets``
    reads as it reads a hub name), through 2 encoding workers, over 2 epochs."""
    import datasets

    import megatron_loop.data.sources as sources
    from megatron_loop.data.preprocess import PreprocessOptions, preprocess
    from megatron_loop.data.tokenizer import load_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(sources, "resolve_local_inputs", lambda spec: None)  # take the hub code path
    texts = data_assets().documents[:150]
    write_jsonl(tmp_path / "hub" / "train.jsonl", texts)
    hub = sources.HFSource(str(tmp_path / "hub"), streaming=True, shuffle_buffer=10, seed=42)
    prefix = str(tmp_path / "p")
    preprocess(hub.name, str(data_assets().tokenizer), prefix,
               PreprocessOptions(hf=hub, workers=2, batch_size=16, progress=False))
    streamed = list(sources.iter_hf_documents(hub))
    assert streamed != texts and sorted(streamed) == sorted(texts)  # the buffer did shuffle
    tok = load_tokenizer(str(data_assets().tokenizer))
    expected = np.concatenate([tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                               for t in streamed])
    ds = PackedDataset(prefix, SEQ, seed=3, num_epochs=2, order="stream")
    assert len(ds) == 2 * len(expected) // SEQ
    np.testing.assert_array_equal(np.concatenate([ds.get_tokens(i) for i in range(len(ds))]),
                                  np.tile(expected, 2)[: len(ds) * SEQ])
    shuffled = PackedDataset(prefix, SEQ, seed=3)  # the default permutes the documents again
    assert sorted(shuffled.index.doc_order.tolist()) == list(range(len(texts)))
    assert shuffled.index.doc_order.tolist() != list(range(len(texts)))
    with pytest.raises(LoopConfigError, match="data.order='random': expected one of"):
        PackedDataset(prefix, SEQ, seed=3, order="random")
    # the config key reaches the training loader
    from megatron_loop.config import config_from_dict
    from megatron_loop.data.loaders import build_train_valid_loaders

    cfg = config_from_dict({"data": {"train_prefixes": [prefix], "order": "stream"}})
    loaders = build_train_valid_loaders(cfg.data, seq_length=SEQ, global_batch_size=2, micro_batch_size=2)
    np.testing.assert_array_equal(next(iter(loaders.train))["tokens"][0].numpy(), expected[:SEQ])


def test_seq_length_longer_than_data(prefix):
    documents = len(data_assets().documents) - 50  # the train prefix holds all but 50 validation documents
    with pytest.raises(LoopDataError, match=rf"indexed dataset '{prefix}': \d+ tokens in {documents} documents "
                                            r"cannot fill one sequence of seq_length 1000000; expected "
                                            r"at least 1000000 tokens"):
        PackedDataset(prefix, 1_000_000, seed=0)


def test_index_build_is_vectorised_and_fast():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, size=2_000_000).astype(np.int32)  # ~2e9 tokens
    start = time.perf_counter()
    idx = build_pack_index(lengths, 2048, seed=42)
    elapsed = time.perf_counter() - start
    assert len(idx) == int(lengths.sum(dtype=np.int64)) // 2048
    # Spot-check the index against cumulative sums: sample i starts at token i * 2048.
    ends = np.cumsum(lengths[idx.doc_order], dtype=np.int64)
    for i in (0, 1, len(idx) // 2, len(idx) - 1):
        d, off = idx.sample_doc[i], idx.sample_offset[i]
        assert (ends[d] - lengths[idx.doc_order[d]]) + off == i * 2048 and 0 <= off < lengths[idx.doc_order[d]]
    assert elapsed < 10, f"index build took {elapsed:.1f}s for 2M documents"


def test_pickled_dataset_reopens_maps(prefix):
    import pickle

    ds = PackedDataset(prefix, SEQ, seed=9)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 1000  # paths and settings, not the index arrays
    assert clone.cache_hit and len(clone) == len(ds)
    np.testing.assert_array_equal(clone.get_tokens(len(ds) - 1), ds.get_tokens(len(ds) - 1))
