"""``atomic.py``: files and folders published whole (the kills mid-write: tests/integration/reliability/
test_outputs.py and test_exports.py)."""

from __future__ import annotations

import os
import stat

import pytest

from megatron_loop.atomic import (atomic_path, clean_leftovers, process_alive, publish_folder, staging_folder,
                                  swap_folder, write_atomic)


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_write_atomic_text_and_bytes_leave_only_the_target(tmp_path):
    target = tmp_path / "sub" / "report.json"
    assert write_atomic(target, "héllo") == target
    assert target.read_bytes() == "héllo".encode()
    write_atomic(target, b"\x00\x01", durable=True)
    assert target.read_bytes() == b"\x00\x01"
    assert _names(target.parent) == ["report.json"]


def test_atomic_path_keeps_the_suffix_hidden_and_removes_it_on_error(tmp_path):
    target = tmp_path / "fig.png"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".fig.png.tmp-") and tmp.suffix == ".png"
            assert f"-{os.getpid()}-" in tmp.name
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    assert target.read_text() == "old"  # the previous version stays
    assert _names(tmp_path) == ["fig.png"]


def test_swap_folder_replaces_and_removes_the_retired_one(tmp_path):
    new, target, retired = tmp_path / "new", tmp_path / "out", tmp_path / "retired"
    new.mkdir()
    (new / "a").write_text("new")
    assert swap_folder(new, target, retired) == target  # no previous folder
    other = tmp_path / "new2"
    other.mkdir()
    (other / "b").write_text("newer")
    swap_folder(other, target, retired)
    assert _names(target) == ["b"] and not retired.exists() and not other.exists()


def test_publish_folder_applies_the_umask_to_library_written_modes(tmp_path):
    out = tmp_path / "export"
    tmp = staging_folder(out)
    assert tmp.name.startswith(".export.tmp-") and tmp.is_dir()
    (tmp / "model.safetensors").write_bytes(b"w")
    os.chmod(tmp / "model.safetensors", 0o600)  # as some libraries write
    old = os.umask(0o027)
    try:
        publish_folder(tmp, out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out / "model.safetensors").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert _names(tmp_path) == ["export"]


def test_clean_leftovers_restores_a_swapped_out_folder_and_removes_dead_staging(tmp_path):
    out = tmp_path / "export"
    dead = 2 ** 22 + 4321  # above the default pid_max: no such process
    retired = tmp_path / f".export.old-{dead}-abc123"
    retired.mkdir()
    (retired / "config.json").write_text("{}")
    staging = tmp_path / f".export.tmp-{dead}-def456"
    staging.mkdir()
    mine = staging_folder(out)  # this process's own staging folder counts as abandoned too
    done = clean_leftovers(out)
    first, *removed = done
    assert first == f"restored the previous {out} from {retired.name}"
    assert removed == [f"removed the unfinished export {p}" for p in sorted([staging, mine])]
    assert _names(tmp_path) == ["export"] and _names(out) == ["config.json"]


def test_a_running_writers_staging_folder_is_left_alone(tmp_path):
    out = tmp_path / "export"
    parent_pid = os.getppid()  # alive, and not this process
    staging = tmp_path / f".export.tmp-{parent_pid}-aaaaaa"
    staging.mkdir()
    assert clean_leftovers(out) == []
    assert staging.is_dir()


def test_process_alive_checks_the_start_time():
    assert process_alive(os.getpid())
    assert not process_alive(2 ** 22 + 4321)
    assert not process_alive(os.getpid(), started_epoch=0.0)  # a newer process reused the number
