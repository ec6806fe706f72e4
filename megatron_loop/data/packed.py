"""Packed fixed-length training sequences over one indexed prefix (App. C.1).

"The resulting token stream is concatenated and packed into non-overlapping sequences of length
2,048, and incomplete final sequences are discarded." Documents (indexed sequences, each ending
in EOS) are put in a seed-determined shuffled order; the stream of their tokens is cut into
consecutive ``seq_length`` windows; the tail shorter than ``seq_length`` is dropped. Each item is
the full window ``tokens`` (``seq_length`` ids); the model reads ``tokens[:-1]`` and predicts
``tokens[1:]``, so the loss averages ``seq_length - 1`` predictions.

With ``num_epochs > 1`` the stream is the concatenation of ``num_epochs`` independently shuffled
passes (epoch ``e`` uses ``default_rng([seed, e])``), packed as one stream.

``order="stream"`` (``data.order: stream``) skips the permutation: documents are packed in the
order preprocessing wrote them, every epoch. That is the paper's order (App. C.1: "We stream the
training data and shuffle examples using a buffer of 10,000 documents and random seed 42", i.e.
one shuffle, at streaming time, which ``tools/preprocess_data.py --streaming --shuffle-buffer
10000 --seed 42`` reproduces) and ``data.order``'s default; ``shuffled`` permutes the documents once
more (this class's default ``order``, kept for its callers: held-out loss and probe sampling).

The index (document order, and each sample's first document and offset in it) is built with
vectorised numpy (a cumulative sum and a ``searchsorted``; no Python loop per document) and
cached next to the data as ``.npy`` files named by a hash of its inputs, then memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from megatron_loop.atomic import atomic_path, write_atomic
from megatron_loop.config import DATA_ORDERS as ORDERS
from megatron_loop.data.indexed import open_indexed
from megatron_loop.errors import LoopConfigError, LoopDataError

_INDEX_VERSION = 1
_ARRAYS = ("doc_order", "sample_doc", "sample_offset")


@dataclass(frozen=True)
class PackIndex:
    """``doc_order[j]``: the j-th document of the stream; sample ``i`` starts at token
    ``sample_offset[i]`` of stream document ``sample_doc[i]`` (a position in ``doc_order``)."""

    doc_order: np.ndarray
    sample_doc: np.ndarray
    sample_offset: np.ndarray

    def __len__(self) -> int:
        return len(self.sample_doc)


def build_pack_index(lengths: np.ndarray, seq_length: int, seed: int, num_epochs: int = 1,
                     order: str = "shuffled") -> PackIndex:
    """Vectorised packing index for documents of ``lengths`` tokens (``order``: see the module doc)."""
    if order not in ORDERS:
        raise LoopConfigError(f"data.order={order!r}: expected one of {ORDERS}")
    n = len(lengths)
    order_dtype = np.int32 if n < 2**31 else np.int64
    if order == "stream":
        doc_order = np.tile(np.arange(n, dtype=order_dtype), num_epochs)
    else:
        doc_order = np.concatenate([np.random.default_rng([seed, e]).permutation(n).astype(order_dtype)
                                    for e in range(num_epochs)])
    ends = np.cumsum(lengths[doc_order], dtype=np.int64)  # stream position after each document
    num_samples = int(ends[-1]) // seq_length if n else 0
    starts = np.arange(num_samples, dtype=np.int64) * seq_length
    # The document holding stream token s is the first whose end exceeds s.
    sample_doc = np.searchsorted(ends, starts, side="right")
    sample_offset = starts - (ends[sample_doc] - lengths[doc_order[sample_doc]])
    return PackIndex(doc_order, sample_doc.astype(np.int64), sample_offset.astype(np.int64))


def _cache_files(prefix: str, cache_dir: str | None, key: dict) -> dict[str, Path]:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir else Path(prefix).parent
    stem = f"{Path(prefix).name}.pack-{digest}"
    files = {name: folder / f"{stem}.{name}.npy" for name in _ARRAYS}
    files["key"] = folder / f"{stem}.json"
    return files


def _load_cached(files: dict[str, Path]) -> PackIndex | None:
    if not all(files[name].is_file() for name in _ARRAYS):
        return None
    try:
        return PackIndex(*(np.load(files[name], mmap_mode="r") for name in _ARRAYS))
    except (OSError, ValueError):
        return None  # a damaged cache file is rebuilt


def _save_cache(files: dict[str, Path], index: PackIndex, key: dict) -> bool:
    """Write each array under a temporary name then rename: concurrent ranks building the same
    index never read a half-written file."""
    try:
        files["key"].parent.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            with atomic_path(files[name]) as tmp, open(tmp, "wb") as f:
                np.save(f, getattr(index, name))
        write_atomic(files["key"], json.dumps(key, indent=2) + "\n")
        return True
    except OSError as e:
        warnings.warn(f"cannot cache the packing index in {files['key'].parent} ({e}); "
                      "it will be rebuilt next time (set data.cache_dir)")
        return False


class PackedDataset(torch.utils.data.Dataset):
    """Non-overlapping ``seq_length``-token windows of the (shuffled or stream-order) document
    stream of ``prefix``.

    ``dataset[i]`` is ``{"tokens": LongTensor[seq_length]}``.
    """

    def __init__(self, prefix: str | os.PathLike, seq_length: int, seed: int, num_epochs: int = 1,
                 cache_dir: str | None = None, order: str = "shuffled") -> None:
        if seq_length < 2:
            raise LoopConfigError(f"seq_length {seq_length}: expected at least 2 (one prediction)")
        if num_epochs < 1:
            raise LoopConfigError(f"num_epochs {num_epochs}: expected at least 1")
        if order not in ORDERS:
            raise LoopConfigError(f"data.order={order!r}: expected one of {ORDERS}")
        self.order = order
        self.prefix = str(prefix)
        self.seq_length = seq_length
        self.seed = seed
        self.num_epochs = num_epochs
        self.cache_dir = cache_dir
        self._open()

    def _open(self) -> None:
        self.indexed = open_indexed(self.prefix)
        self.lengths = self.indexed.sequence_lengths
        self.num_documents = len(self.lengths)
        self.tokens_per_epoch = int(self.lengths.sum(dtype=np.int64))
        if self.tokens_per_epoch * self.num_epochs < self.seq_length:
            raise LoopDataError(
                f"indexed dataset '{self.prefix}': {self.tokens_per_epoch} tokens in "
                f"{self.num_documents} documents cannot fill one sequence of seq_length "
                f"{self.seq_length}; expected at least {self.seq_length} tokens")
        key = {"prefix": Path(self.prefix).name, "seq_length": self.seq_length, "seed": self.seed,
               "num_epochs": self.num_epochs, "order": self.order, "num_documents": self.num_documents,
               "num_tokens": self.tokens_per_epoch, "version": _INDEX_VERSION,
               # Content, not just counts: a re-tokenised corpus of the same size must not
               # reuse a stale index (hashing the lengths costs far less than rebuilding).
               "lengths_sha1": hashlib.sha1(np.ascontiguousarray(self.lengths).tobytes()).hexdigest()}
        self.cache_files = _cache_files(self.prefix, self.cache_dir, key)
        index = _load_cached(self.cache_files)
        self.cache_hit = index is not None
        if index is None:
            index = build_pack_index(self.lengths, self.seq_length, self.seed, self.num_epochs, self.order)
            if _save_cache(self.cache_files, index, key):
                index = _load_cached(self.cache_files) or index
        self.index = index

    def __getstate__(self) -> dict:
        # DataLoader workers reopen the memory maps instead of pickling the arrays.
        return {k: self.__dict__[k] for k in ("prefix", "seq_length", "seed", "num_epochs", "cache_dir", "order")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self.index)

    def get_tokens(self, i: int) -> np.ndarray:
        """The ``i``-th window as int64 ids, gathered across document boundaries."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} packed sequences")
        out = np.empty(self.seq_length, dtype=np.int64)
        pos, offset, filled = int(self.index.sample_doc[i]), int(self.index.sample_offset[i]), 0
        while filled < self.seq_length:
            doc = int(self.index.doc_order[pos])
            n = min(int(self.lengths[doc]) - offset, self.seq_length - filled)
            out[filled:filled + n] = self.indexed.get(doc, offset=offset, length=n)
            filled, pos, offset = filled + n, pos + 1, 0
        return out

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": torch.from_numpy(self.get_tokens(int(i)))}


def epochs_for(prefix_tokens: int, seq_length: int, samples: int) -> int:
    """Smallest number of passes whose packed stream yields at least ``samples`` sequences."""
    if prefix_tokens <= 0:
        return 1
    return max(1, -(-(samples * seq_length) // prefix_tokens))
