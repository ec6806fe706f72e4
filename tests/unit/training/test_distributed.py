"""``training/distributed.py``: the launcher watch, the one-line explanations of failed collectives, and
rank 0 deciding for everyone (the multi-rank runs: tests/integration/reliability/test_rank_agreement.py and
test_runfolder.py). ``on_main``'s broadcast is replaced by a one-rank identity here."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.training import distributed as D
from megatron_loop.training.distributed import (DistInfo, _is_launcher, collective_failure, launcher_gone,
                                                launcher_processes, on_main)


def test_launcher_command_lines():
    assert _is_launcher(["/usr/bin/python", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"])
    assert _is_launcher(["python", "-m", "torch.distributed.run", "train.py"])
    assert _is_launcher(["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"])
    assert _is_launcher(["/venv/bin/deepspeed", "pretrain_loop.py"])
    assert not _is_launcher(["python", "pretrain_loop.py", "--config", "run.yaml", "--set", "torchrun"])  # 4 words read
    assert not _is_launcher(["bash", "-c", "python -m torch.distributed.run x"])
    assert launcher_processes() == []  # pytest's parent is no launcher


def test_a_launcher_that_exited_is_noticed():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        handle = psutil.Process(child.pid)
        assert not launcher_gone([handle])
        child.kill()
        child.wait()
        assert launcher_gone([handle])
    finally:
        child.kill()


@pytest.mark.parametrize("text, started, line", [
    ("Connection refused (ECONNREFUSED) ... timeout", True,
     "a rank could not connect to another rank (connection refused: no process listening there, e.g. a rank that "
     "exited, or an old address after a torchrun restart; seen: Connection refused (ECONNREFUSED) ... timeout)"),
    ("[gloo] Timed out waiting 60000ms for recv", True,
     "a collective operation did not complete within train.collective_timeout_s=60 s: another rank stopped, hung or "
     "died"),
    ("Timed out initializing process group\nmore", False,
     "the ranks did not all start within train.collective_timeout_s=60 s (a rank failed, or started much later "
     "than the others; seen: Timed out initializing process group)"),
    ("Connection reset by peer", True,
     "another rank exited in the middle of a collective operation (connection closed by peer)"),
    ("CUDA out of memory", True, None),
])
def test_collective_failures_in_one_line(text, started, line):
    assert collective_failure(RuntimeError(text), 60.0, started=started) == line


def test_rank_0_decides_and_its_errors_reach_every_rank(monkeypatch):
    monkeypatch.setattr(D, "broadcast_object", lambda obj: obj)
    main, other = DistInfo(0, 2, 0), DistInfo(1, 2, 1)
    assert on_main(main, lambda: 42) == 42
    assert on_main(main, lambda: 42, share=False) == 42 and on_main(other, lambda: pytest.fail("rank 1 ran it")) is None
    assert on_main(main, lambda: [1, 2], share=True) == [1, 2]

    def refuse():
        raise LoopDataError("data.train_prefixes[0]: missing")

    with pytest.raises(LoopDataError, match=r"^data.train_prefixes\[0\]: missing$"):
        on_main(main, refuse)

    def crash():
        raise KeyError("x")

    with pytest.raises(KeyError):  # rank 0 raises its own error; the others get "rank 0 failed: ..."
        on_main(main, crash)
    sent = []
    monkeypatch.setattr(D, "broadcast_object", lambda obj: sent.append(obj) or obj)
    with pytest.raises(KeyError):
        on_main(main, crash)
    assert sent[-1] == (("RuntimeError", "rank 0 failed: KeyError: 'x'"), None)
    monkeypatch.setattr(D, "broadcast_object", lambda obj: (("LoopConfigError", "train.lr=-1: expected > 0"), None))
    with pytest.raises(LoopConfigError, match=r"^train.lr=-1: expected > 0$"):
        on_main(other, lambda: None)
