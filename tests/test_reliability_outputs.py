"""Every output a tool writes is published whole (docs/RELIABILITY.md, "Outputs").

``megatron_loop.atomic`` writes to a hidden temporary name in the same folder and renames it
over the target; a writer killed with SIGKILL at any moment leaves the previous version or the
new one, never a truncated file. The probes, curves, run config, checkpoint pointers, metrics
rewrites, bench and demo summaries all go through it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from megatron_loop.atomic import atomic_path, write_atomic

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
