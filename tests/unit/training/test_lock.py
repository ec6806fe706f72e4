"""``training/lock.py``: one run per output folder (the runs that collide: tests/integration/reliability/
test_runfolder.py). The lock is an exclusive ``flock`` plus a holder line; a second holder in this process
opens its own file description, so ``flock`` refuses it exactly as it refuses another process."""

from __future__ import annotations

import json
import os
import socket

import pytest

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.training.lock import LOCK_NAME, RunLock, holder_text, read_holder, run_lock_holder


def test_holder_text_names_host_pid_and_start():
    assert holder_text(None) == "a run that is just starting"
    assert holder_text({}) == "a run that is just starting"
    assert holder_text({"host": "node-3", "pid": 4242, "started": "2026-11-23T01:10:00Z"}) == \
        "host node-3, pid 4242, started 2026-11-23T01:10:00Z"
    assert holder_text({"pid": 7}) == "host ?, pid 7, started ?"


def test_read_holder_empty_json_and_garbage(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"  \n")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_holder(fd) is None
    finally:
        os.close(fd)
    path.write_text('{"host": "h", "pid": 1}\n')
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_holder(fd) == {"host": "h", "pid": 1}
    finally:
        os.close(fd)
    path.write_text("{half a line")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_holder(fd) == {"host": "?", "pid": "?", "started": "?"}
    finally:
        os.close(fd)


def test_acquire_writes_this_process_as_holder_and_release_clears_it(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = RunLock(out).acquire()
    try:
        info = json.loads((out / LOCK_NAME).read_text())
        assert info["host"] == socket.gethostname() and info["pid"] == os.getpid()
        assert info["started"].endswith("Z") and isinstance(info["started_epoch"], float)
        assert lock.taken_over is None and lock.takeover_note() is None
        assert lock.still_ours()
        assert run_lock_holder(out) == holder_text(info)  # a shared flock is refused while it is held
    finally:
        lock.release()
    assert (out / LOCK_NAME).read_text() == ""  # the holder line cleared, the file kept (folder existed)
    assert run_lock_holder(out) is None
    lock.release()  # a second release is a no-op


def test_a_second_run_is_refused_with_the_holder_in_the_message(tmp_path):
    out = tmp_path / "run"
    first = RunLock(out).acquire()
    try:
        with pytest.raises(LoopConfigError) as err:
            RunLock(out).acquire()
        assert str(err.value) == (
            f"{out / LOCK_NAME}: train.output_dir is in use by another run "
            f"(host {socket.gethostname()}, pid {os.getpid()}, started "
            f"{json.loads((out / LOCK_NAME).read_text())['started']}): "
            "wait for it to end, stop it, or choose another train.output_dir")
    finally:
        first.release()


def test_a_folder_created_and_left_empty_is_removed_on_release(tmp_path):
    out = tmp_path / "a" / "b"
    lock = RunLock(out).acquire()
    assert lock.created_dir and out.is_dir()
    lock.release()
    assert not out.exists()
    kept = tmp_path / "c"
    lock = RunLock(kept).acquire()
    (kept / "metrics.jsonl").write_text("{}\n")  # the run wrote something: the folder stays
    lock.release()
    assert sorted(p.name for p in kept.iterdir()) == ["metrics.jsonl", LOCK_NAME]


def test_a_dead_holder_line_is_taken_over_and_said_so(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = {"host": socket.gethostname(), "pid": 2 ** 22 + 12345, "started": "2026-01-01T00:00:00Z",
            "started_epoch": 1.0}
    (out / LOCK_NAME).write_text(json.dumps(dead))
    lock = RunLock(out).acquire()
    try:
        assert lock.taken_over == dead
        assert lock.takeover_note() == (
            f"{out / LOCK_NAME}: taking over train.output_dir from a run that ended without releasing it "
            f"(host {dead['host']}, pid {dead['pid']}, started 2026-01-01T00:00:00Z)")
    finally:
        lock.release()


def test_a_copied_holder_line_of_another_host_is_named_unchecked(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"host": "elsewhere-node", "pid": 1, "started": "s"}))
    lock = RunLock(out).acquire()
    try:
        assert lock.takeover_note() == (
            f"{out / LOCK_NAME}: taking over train.output_dir: the lock file names host elsewhere-node, pid 1, "
            "started s (on another host: not checked) but no process holds its lock: the folder was copied from "
            "another run, or that run holds a copy elsewhere")
    finally:
        lock.release()


def test_still_ours_is_false_once_the_folder_is_moved(tmp_path):
    out = tmp_path / "run"
    lock = RunLock(out).acquire()
    (out / "x").write_text("keep")
    out.rename(tmp_path / "moved")
    assert not lock.still_ours()
    lock.release()  # does not recreate or truncate anything at the old path
    assert not out.exists()
    assert (tmp_path / "moved" / LOCK_NAME).read_text() != ""


def test_an_unwritable_place_is_one_data_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(LoopDataError) as err:
        RunLock(blocker / "run").acquire()
    message = str(err.value)
    assert message.startswith(f"train.output_dir={str(blocker / 'run')!r}: cannot create the folder: ")
    assert message.endswith("; expected a writable location")


def test_no_lock_file_means_no_holder(tmp_path):
    assert run_lock_holder(tmp_path) is None
