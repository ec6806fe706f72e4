"""Indexed-prefix validation: each damaged input gives one clear error naming file and expectation."""

from __future__ import annotations


import pytest

from data_fixtures import copy_prefix, data_assets
from megatron_loop.data.indexed import check_token_ids, max_token_id, open_indexed
from megatron_loop.errors import LoopDataError

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


@pytest.fixture
def prefix_copy(tmp_path) -> str:
    return copy_prefix(tmp_path)


def test_valid_prefix_opens(prefix_copy):
    ds = open_indexed(prefix_copy)
    assert len(ds) == len(data_assets().documents) - 50  # the fixture's train prefix: all but 50 validation documents


def test_missing_prefix(tmp_path):
    with pytest.raises(LoopDataError, match=rf"prefix '{tmp_path}/none': missing {tmp_path}/none.idx "
                                            rf"and {tmp_path}/none.bin; expected P.bin and P.idx"):
        open_indexed(tmp_path / "none")


def test_missing_bin_only(prefix_copy):
    import os

    os.remove(prefix_copy + ".bin")
    with pytest.raises(LoopDataError, match=rf"missing {prefix_copy}.bin;"):
        open_indexed(prefix_copy)


def test_wrong_magic(prefix_copy):
    with open(prefix_copy + ".idx", "r+b") as f:
        f.write(b"NOTANIDX!")
    with pytest.raises(LoopDataError, match=rf"{prefix_copy}.idx: not a Megatron index; expected magic "
                                            r"b'MMIDIDX\\x00\\x00' at the start, found b'NOTANIDX!'"):
        open_indexed(prefix_copy)


@pytest.mark.parametrize("keep", [20, 1000])
def test_truncated_idx(prefix_copy, keep):
    data = open(prefix_copy + ".idx", "rb").read()
    open(prefix_copy + ".idx", "wb").write(data[:keep])
    with pytest.raises(LoopDataError, match=rf"{prefix_copy}.idx: truncated"):
        open_indexed(prefix_copy)


def test_bin_size_mismatch(prefix_copy):
    with open(prefix_copy + ".bin", "ab") as f:
        f.write(b"\x00\x00\x00")
    with pytest.raises(LoopDataError, match=rf"{prefix_copy}.bin: \d+ bytes, but {prefix_copy}.idx "
                                            r"describes \d+ tokens of uint16"):
        open_indexed(prefix_copy)


def test_token_ids_not_below_vocab(prefix_copy):
    largest = max_token_id(prefix_copy)
    assert 0 < largest < 600
    check_token_ids(prefix_copy, largest + 1)  # exactly fits
    with pytest.raises(LoopDataError, match=rf"{prefix_copy}.bin: token id {largest} is not below the "
                                            rf"model's vocab_size {largest}"):
        check_token_ids(prefix_copy, largest)


def test_max_token_id_cache_tracks_file_changes(prefix_copy):
    import numpy as np

    first = max_token_id(prefix_copy)
    tokens = np.memmap(prefix_copy + ".bin", dtype=np.uint16, mode="r+")
    tokens[0] = first + 7
    tokens.flush()
    del tokens
    import os

    st = os.stat(prefix_copy + ".bin")
    os.utime(prefix_copy + ".bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert max_token_id(prefix_copy) == first + 7
