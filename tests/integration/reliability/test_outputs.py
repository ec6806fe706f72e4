"""Every output a tool writes is published whole (docs/RELIABILITY.md, "Outputs").

``megatron_loop.atomic`` writes to a hidden temporary name in the same folder and renames it
over the target; a writer killed with SIGKILL at any moment leaves the previous version or the
new one, never a truncated file. The probes, curves, run config, checkpoint pointers, metrics
rewrites, bench and demo summaries all go through it; HF exports publish a whole folder the
same way."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from megatron_loop.atomic import (atomic_path, clean_leftovers, process_alive, publish_folder, staging_folder,
                                  write_atomic)

SIZE = 4 << 20


@pytest.mark.timeout(120)
def test_a_writer_killed_at_any_moment_leaves_the_old_or_the_new_file(tmp_path):
    target = tmp_path / "results.json"
    write_atomic(target, b"A" * SIZE)
    writer = ("import sys\nfrom megatron_loop.atomic import write_atomic\nprint('go', flush=True)\n"
              "while True:\n    for c in b'BC':\n        write_atomic(sys.argv[1], bytes([c]) * %d)\n" % SIZE)
    seen = set()
    for delay in (0.0, 0.01, 0.03, 0.07, 0.1, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", writer, str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "go\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = target.read_bytes()
        assert len(data) == SIZE and data == data[:1] * SIZE, "a killed writer left a partial file"
        seen.add(data[:1])
    assert seen & {b"B", b"C"}, "the writer never published (the kills came too early to test anything)"


def test_an_error_while_writing_keeps_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "geometry.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the figure library failed")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["geometry.png"]
    assert tmp.suffix == ".png"  # writers that choose the format from the suffix still do


def test_folder_leftovers_of_a_dead_writer_are_cleaned_and_a_live_writers_are_kept(tmp_path):
    """After a folder publish killed half-way (an HF export): the old folder swapped out is put back,
    the staging folder of a dead writer is removed, and one of a writer still running is left alone
    (its pid is in the name; a pid is alive only if its process started before the name was made)."""
    out = tmp_path / "hf"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        assert process_alive(live.pid) and not process_alive(dead.pid)
        assert not process_alive(live.pid, started_epoch=time.time() - 3600)  # a newer process, same pid
        (tmp_path / f".hf.old-{dead.pid}-abc123").mkdir()
        (tmp_path / f".hf.old-{dead.pid}-abc123" / "config.json").write_text("old")
        (tmp_path / f".hf.tmp-{dead.pid}-def456").mkdir()
        (tmp_path / f".hf.tmp-{live.pid}-0a1b2c").mkdir()
        done = clean_leftovers(out)
    finally:
        live.kill()
        live.wait()
    assert done == [f"restored the previous {out} from .hf.old-{dead.pid}-abc123",
                    f"removed the unfinished export {tmp_path / f'.hf.tmp-{dead.pid}-def456'}"]
    assert (out / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".hf.tmp-{live.pid}-0a1b2c", "hf"]

    new = staging_folder(out)
    (new / "config.json").write_text("new")
    publish_folder(new, out)
    assert (out / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".hf.tmp-{live.pid}-0a1b2c", "hf"]
