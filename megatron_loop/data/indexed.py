"""Open and validate Megatron indexed datasets (``P.bin`` / ``P.idx``) with clear errors.

The format is megatron-core's (``IndexedDataset``/``IndexedDatasetBuilder``); this module only
checks a prefix before handing it to megatron-core, whose own checks are bare ``assert``s or
numpy errors that name neither the file nor what was expected.

``.idx`` layout (megatron-core ``_IndexWriter``): magic ``MMIDIDX\\x00\\x00`` (9 bytes), version
u64 = 1, dtype code u8, sequence count u64, document count u64, then int32 sequence lengths,
int64 sequence pointers, int64 document indices.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
from megatron.core.datasets.indexed_dataset import (
    _INDEX_HEADER,
    DType,
    IndexedDataset,
    get_bin_path,
    get_idx_path,
)

from megatron_loop.atomic import write_atomic
from megatron_loop.data.prefix_files import prefix_file_problem
from megatron_loop.errors import LoopDataError

_HEADER_BYTES = len(_INDEX_HEADER) + 8 + 1 + 8 + 8  # magic, version, dtype code, two counts
_SCAN_CHUNK = 1 << 24  # tokens per chunk when scanning for the largest id


def _read_header(idx_path: str) -> tuple[np.dtype, int, int]:
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(_HEADER_BYTES)
    magic = head[: len(_INDEX_HEADER)]
    if magic != _INDEX_HEADER:
        raise LoopDataError(f"{idx_path}: not a Megatron index; expected magic {_INDEX_HEADER!r} at "
                            f"the start, found {magic!r}")
    if len(head) < _HEADER_BYTES:
        raise LoopDataError(f"{idx_path}: truncated header ({size} bytes); expected at least "
                            f"{_HEADER_BYTES} bytes")
    version, code, n_seq, n_doc = struct.unpack("<QBQQ", head[len(_INDEX_HEADER):])
    if version != 1:
        raise LoopDataError(f"{idx_path}: index version {version}; expected version 1")
    try:
        dtype = np.dtype(DType.dtype_from_code(code))
    except (KeyError, ValueError):
        raise LoopDataError(f"{idx_path}: unknown dtype code {code}; expected one of "
                            f"{[d.value for d in DType]}") from None
    expected = _HEADER_BYTES + n_seq * (4 + 8) + n_doc * 8
    if size < expected:
        raise LoopDataError(f"{idx_path}: truncated; {size} bytes, expected {expected} for "
                            f"{n_seq} sequences and {n_doc} document boundaries")
    if n_doc < 1:
        raise LoopDataError(f"{idx_path}: no document boundaries; expected at least the leading 0")
    return dtype, n_seq, n_doc


def open_indexed(prefix: str | os.PathLike) -> IndexedDataset:
    """megatron-core ``IndexedDataset`` for ``prefix`` after checking both files are complete."""
    prefix = str(prefix)
    idx_path, bin_path = get_idx_path(prefix), get_bin_path(prefix)
    problem = prefix_file_problem(prefix, (".idx", ".bin"))
    if problem:
        raise LoopDataError(f"indexed dataset prefix '{prefix}': {problem}; "
                            "expected P.bin and P.idx written by tools/preprocess_data.py")
    dtype, _, _ = _read_header(idx_path)
    ds = IndexedDataset(prefix, mmap=True)
    lengths = ds.index.sequence_lengths
    if ds.index.document_indices[-1] != len(lengths):
        raise LoopDataError(f"{idx_path}: document indices end at {ds.index.document_indices[-1]}, "
                            f"expected the sequence count {len(lengths)}")
    expected = int(lengths.sum(dtype=np.int64)) * dtype.itemsize
    actual = os.path.getsize(bin_path)
    if actual != expected:
        raise LoopDataError(f"{bin_path}: {actual} bytes, but {idx_path} describes "
                            f"{expected // dtype.itemsize} tokens of {dtype.name} = {expected} bytes")
    return ds


def count_tokens(prefix: str | os.PathLike) -> int:
    """Total tokens of a validated prefix."""
    ds = open_indexed(prefix)
    # Keep ``ds`` referenced while reading: its __del__ closes the memory map under the view.
    total = int(ds.index.sequence_lengths.sum(dtype=np.int64))
    del ds
    return total


def max_token_id(prefix: str | os.PathLike) -> int:
    """Largest token id in ``P.bin``, scanned in chunks and cached in ``P.maxid.json`` (keyed by
    the .bin size and mtime) because a full scan of a large corpus takes seconds."""
    prefix = str(prefix)
    bin_path = get_bin_path(prefix)
    dtype, _, _ = _read_header(get_idx_path(prefix))
    st = os.stat(bin_path)
    key = {"bin_size": st.st_size, "bin_mtime_ns": st.st_mtime_ns}
    cache = Path(prefix + ".maxid.json")
    if cache.is_file():
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                return int(data["max_token_id"])
        except (ValueError, KeyError):
            pass  # a corrupt cache is simply rebuilt
    tokens = np.memmap(bin_path, dtype=dtype, mode="r") if st.st_size else np.zeros(0, dtype)
    result = -1
    for start in range(0, len(tokens), _SCAN_CHUNK):
        result = max(result, int(tokens[start:start + _SCAN_CHUNK].max()))
    try:
        write_atomic(cache, json.dumps({"key": key, "max_token_id": result}))
    except OSError:
        pass  # read-only data folder: the scan is repeated next time
    return result


def check_token_ids(prefix: str | os.PathLike, vocab_size: int) -> None:
    """Raise LoopDataError if ``P.bin`` holds a token id >= ``vocab_size`` (the model's)."""
    largest = max_token_id(prefix)
    if largest >= vocab_size:
        raise LoopDataError(f"{get_bin_path(str(prefix))}: token id {largest} is not below the model's "
                            f"vocab_size {vocab_size}; expected data tokenised with a vocabulary of "
                            f"at most {vocab_size} tokens (raise model.vocab_size or re-tokenise)")


CONTENT_BLOCKS = 256  # sampled blocks of P.bin in the content fingerprint
CONTENT_BLOCK_BYTES = 1 << 16


def content_fingerprint(prefix: str) -> str:
    """sha256 of ``P.idx`` (document boundaries) and of ``CONTENT_BLOCKS`` blocks of
    ``CONTENT_BLOCK_BYTES`` at evenly spaced offsets of ``P.bin`` (the first and last included):
    data replaced by other tokens of the same size is caught without reading the whole corpus.
    Cost: the index (about 20 bytes per document) plus 16 MiB of tokens, whatever the corpus size;
    a change confined to the bytes between sampled blocks goes unnoticed."""
    import hashlib

    digest = hashlib.sha256()
    with open(get_idx_path(prefix), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    bin_path = get_bin_path(prefix)
    size = os.path.getsize(bin_path)
    last = max(size - CONTENT_BLOCK_BYTES, 0)
    offsets = sorted({last * i // (CONTENT_BLOCKS - 1) for i in range(CONTENT_BLOCKS)})
    with open(bin_path, "rb") as f:
        for offset in offsets:
            f.seek(offset)
            digest.update(f.read(CONTENT_BLOCK_BYTES))
    return digest.hexdigest()


class DataWatch:
    """The data files a run opened (``P.bin`` and ``P.idx`` of each prefix), as they were then.

    The loaders read them through memory maps: a file truncated or rewritten in place under a live run
    (``cp`` over it, preprocessing re-run into the same prefix by a tool that writes in place) makes
    the next read past its new end a SIGBUS, which kills the process without a word (exit 135) or a
    DataLoader worker with torch's misleading shared-memory hint. :meth:`check` runs before every batch
    (a stat per file) and turns such a change into one line naming the file; a file replaced by a
    rename (a new inode) is safe to go on with -- the maps hold the file the run opened -- and is
    reported once (the next resume compares the new content, ``training/resume.py``)."""

    def __init__(self, prefixes: list[str]) -> None:
        self.files: dict[str, os.stat_result] = {}
        for prefix in prefixes:
            for path in (get_bin_path(prefix), get_idx_path(prefix)):
                self.files[path] = os.stat(path)
        self.replaced: set[str] = set()

    def problem(self) -> str | None:
        """One line for the first data file changed in place since the run opened it (None: none)."""
        for path, then in self.files.items():
            try:
                now = os.stat(path)
            except OSError:  # removed: the maps still hold it, like a replaced file
                now = None
            if now is None or (now.st_ino, now.st_dev) != (then.st_ino, then.st_dev):
                if path not in self.replaced:
                    self.replaced.add(path)
                    print(f"warning: {path}: {'removed' if now is None else 'replaced'} during the run; this run "
                          "reads the file it opened (a resume compares the new one with its checkpoint)",
                          file=sys.stderr, flush=True)
                continue
            if now.st_size != then.st_size:
                return (f"{path}: {now.st_size} bytes now, {then.st_size} when the run opened it: the data file "
                        "changed in place during the run (truncated or rewritten, e.g. copied over or preprocessed "
                        "again into the same prefix), so its memory map would read past the new end (SIGBUS); "
                        "restore the file, or write new data under a new prefix and start a new run")
        return None

    def check(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise LoopDataError(problem)
