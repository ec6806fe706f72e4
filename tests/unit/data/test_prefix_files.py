"""``data/prefix_files.py``: what is wrong with an indexed dataset's two files, as one phrase."""

from __future__ import annotations

import os

from megatron_loop.data.prefix_files import prefix_file_problem


def test_both_present_is_no_problem(tmp_path):
    p = tmp_path / "d"
    for ext in (".bin", ".idx"):
        (tmp_path / f"d{ext}").write_bytes(b"x")
    assert prefix_file_problem(str(p)) is None


def test_both_missing_is_one_phrase(tmp_path):
    p = str(tmp_path / "d")
    assert prefix_file_problem(p) == f"missing {p}.bin and {p}.idx"


def test_one_missing_names_only_it(tmp_path):
    p = str(tmp_path / "d")
    (tmp_path / "d.bin").write_bytes(b"x")
    assert prefix_file_problem(p) == f"missing {p}.idx"


def test_a_fifo_is_refused_as_what_it_is(tmp_path):
    p = str(tmp_path / "d")
    os.mkfifo(f"{p}.bin")
    assert prefix_file_problem(p) == f"{p}.bin is a named pipe (FIFO), not a regular file and missing {p}.idx"


def test_a_dangling_link_says_where_it_points(tmp_path):
    p = str(tmp_path / "d")
    os.symlink(tmp_path / "gone.bin", f"{p}.bin")
    os.symlink(tmp_path / "gone.idx", f"{p}.idx")
    # each has a link note, so they are joined whole, not shortened to "missing A and B"
    assert prefix_file_problem(p) == (f"missing {p}.bin (a link to the missing {tmp_path / 'gone.bin'}) and "
                                      f"missing {p}.idx (a link to the missing {tmp_path / 'gone.idx'})")
