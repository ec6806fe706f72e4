"""``errors.py``: the words of the one-line error contract (the command lines that print them:
tests/integration/reliability/test_errors.py and test_write_paths.py)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from megatron_loop.errors import (LoopConfigError, LoopDataError, file_problem, first_line, os_error_line,
                                  os_error_text, path_kind, user_path, write_failure)


def test_both_errors_are_value_errors():
    assert issubclass(LoopConfigError, ValueError) and issubclass(LoopDataError, ValueError)


def test_os_error_text_plain_words_and_errno_name():
    assert os_error_text(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device (ENOSPC)"
    assert os_error_text(OSError(errno.EROFS, "x")) == "read-only file system (EROFS)"
    assert os_error_text(OSError(errno.EBUSY, "Device or resource busy")) == "Device or resource busy (EBUSY)"
    assert os_error_text(OSError("no errno at all")) == "no errno at all"


def test_path_kind_names_each_kind():
    assert path_kind(stat.S_IFDIR) == "a folder"
    assert path_kind(stat.S_IFIFO) == "a named pipe (FIFO)"
    assert path_kind(stat.S_IFCHR) == "a character device"
    assert path_kind(stat.S_IFBLK) == "a block device"
    assert path_kind(stat.S_IFSOCK) == "a socket"
    assert path_kind(stat.S_IFLNK) == "not a file"


def test_file_problem(tmp_path):
    regular = tmp_path / "f"
    regular.write_text("x")
    os.symlink(regular, tmp_path / "link")
    assert file_problem(str(regular)) is None and file_problem(str(tmp_path / "link")) is None
    assert file_problem(str(tmp_path / "none")) == f"missing {tmp_path / 'none'}"
    assert file_problem(str(tmp_path)) == f"{tmp_path} is a folder, not a regular file"
    os.symlink("/dev/zero", tmp_path / "zero")
    assert file_problem(str(tmp_path / "zero")) == (f"{tmp_path / 'zero'} (a link to /dev/zero) is a character "
                                                    "device, not a regular file")


@pytest.mark.parametrize("temporary, known", [
    (".report.json.tmp-4242-a1b2c3.json", "report.json"),  # atomic.py's staging file
    (".export.old-17-0f0f0f", "export"),  # a folder swapped out
    ("train.tmp99.bin", "train.bin"),  # preprocessing's prefix
    ("train.tmp99_valid.idx", "train_valid.idx"),
    ("plain.txt", "plain.txt"),
])
def test_user_path_names_what_a_temporary_file_stands_for(temporary, known):
    assert user_path(f"/out/{temporary}") == f"/out/{known}"
    assert user_path("/out/.write_probe.123") == "/out"


def test_os_error_line_names_the_target_and_shared_memory():
    assert os_error_line(OSError(errno.ENOSPC, "x", "/runs/.latest.tmp-1-abcdef")) == \
        "/runs/latest: no space left on device (ENOSPC)"
    rename = OSError(errno.EISDIR, "Is a directory", "/runs/.latest.tmp-1-abcdef", None, "/runs/latest")
    assert os_error_line(rename).startswith("/runs/latest: ")  # the rename's target, not the temporary file
    assert os_error_line(OSError(errno.ENOSPC, "x", "/dev/shm/torch_123")) == (
        "/dev/shm/torch_123: no space left on device (ENOSPC) in shared memory (/dev/shm); give the job more "
        "shared memory")
    assert os_error_line(OSError(errno.EIO, "x")) == "input/output error (EIO)"


def test_first_line():
    assert first_line(ValueError("  one\ntwo  ")) == "one"
    assert first_line(KeyError()) == "KeyError"


def test_write_failure_of_an_os_error_and_of_a_library_message(tmp_path):
    assert write_failure(OSError(errno.EDQUOT, "q", str(tmp_path / ".m.pt.tmp-3-abcdef.pt")), tmp_path) == \
        f"disk quota exceeded (EDQUOT): {tmp_path / 'm.pt'}"
    assert write_failure(RuntimeError("I/O error: os error 28"), tmp_path) == \
        "no space left on device (ENOSPC) (I/O error: os error 28)"
    message = write_failure(RuntimeError("[enforce fail at inline_container.cc] unexpected pos\nmore"), tmp_path)
    # the probe write succeeds here: the library's line with the free space of the file system
    assert message.startswith("[enforce fail at inline_container.cc] unexpected pos (") and message.endswith(
        " MiB free on that file system)")
    assert os.listdir(tmp_path) == []  # the probe file is removed
