"""``export/output_folder.py``: what ``--overwrite`` may replace. Only an export this tool wrote and nobody
changed: never a run folder or a checkpoint, never a folder with files the export did not write; an export
is never written inside a checkpoint. One export per folder: a second lock on it is refused while the first
is held (in another process: tests/integration/reliability/test_exports.py), the hidden lock file goes with
the holder, and a folder that cannot be written is one error before any work."""

from __future__ import annotations

import json
import os

import pytest

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.export.output_folder import (EXPORT_RECORD, ExportLock, check_not_in_a_checkpoint,
                                                check_replaceable, write_export_record)


def _export(folder):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")
    write_export_record(folder)
    return folder


def test_an_unchanged_export_may_be_replaced_and_one_with_another_file_may_not(tmp_path):
    out = _export(tmp_path / "hf")
    check_replaceable(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LoopDataError, match=r"notes.txt that the export did not write; --overwrite would delete them"):
        check_replaceable(out)


def test_a_run_folder_or_an_unrecorded_folder_is_never_replaced(tmp_path):
    run = _export(tmp_path / "run")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(LoopDataError, match=r"holds a training run or checkpoints \(metrics.jsonl\)"):
        check_replaceable(run)
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("")
    with pytest.raises(LoopDataError, match=rf"not an export written by convert_to_hf.py \(no readable {EXPORT_RECORD}"):
        check_replaceable(other)


def test_no_export_inside_a_checkpoint(tmp_path):
    with pytest.raises(LoopDataError, match=r"inside the checkpoint folder .*global_step4"):
        check_not_in_a_checkpoint(tmp_path / "checkpoints" / "global_step4" / "hf")
    check_not_in_a_checkpoint(tmp_path / "run" / "hf")


def test_a_second_export_to_a_held_folder_is_refused_and_the_lock_file_goes_with_the_holder(tmp_path):
    out = tmp_path / "hf"
    with ExportLock(out) as held:
        assert held.path == tmp_path / ".hf.lock"
        assert json.loads(held.path.read_text())["pid"] == os.getpid()  # who holds it, for the error
        with pytest.raises(LoopConfigError, match=rf"^{out}: another export to this folder is running \(host "):
            ExportLock(out).__enter__()
    assert not held.path.exists()
    with ExportLock(out):  # free again
        pass


def test_a_folder_that_cannot_be_made_is_one_error(tmp_path):
    (tmp_path / "file").write_text("")  # the output's parent is a file: nothing can be written under it
    with pytest.raises(LoopDataError, match=r"/file/hf: cannot write an export there \(.*\); expected a writable"):
        ExportLock(tmp_path / "file" / "hf").__enter__()
