"""``pretrain_loop.py`` with one injected fault, for the reliability tests (issue 9).

    python tests/train_scripts/faults.py FAULT [pretrain_loop.py arguments]

FAULT is one of
  nan@A:S1,S2,...        the training loss of optimizer steps S1, S2, ... becomes NaN
                         (A: micro-batches per step on this rank, i.e. accumulation steps)
  kill_before_publish@N  SIGKILL this process on the N-th save, after every shard is written
                         and verified but before the checkpoint is published
  enospc_on_save@N       the N-th save fails with "No space left on device" half-way through
                         its first shard (torch.save, as DeepSpeed calls it)
  slow@SECONDS           every training forward sleeps SECONDS (time to deliver a signal mid-run)
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _counter():
    count = {"n": 0}

    def bump() -> int:
        count["n"] += 1
        return count["n"]

    return bump


def inject_nan(accumulation: int, steps: set[int]) -> None:
    import torch

    from megatron_loop.model.looplm import LoopLM

    forward = LoopLM.forward
    bump = _counter()

    def patched(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.training and out.loss is not None:
            step = (bump() - 1) // accumulation + 1
            if step in steps:
                out.loss = out.loss * torch.tensor(float("nan"))
        return out

    LoopLM.forward = patched


def kill_before_publish(nth: int) -> None:
    from megatron_loop.training import checkpoint

    publish = checkpoint.publish
    bump = _counter()

    def patched(root, partial, tag):
        if bump() == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return publish(root, partial, tag)

    checkpoint.publish = patched


def enospc_on_save(nth: int) -> None:
    """The first file of the nth checkpoint is half written, then the disk is full."""
    import torch

    save = torch.save
    seen: list[str] = []

    def patched(obj, f, *args, **kwargs):
        folder = os.path.dirname(str(f))
        if folder.endswith(".partial") and folder not in seen:
            seen.append(folder)
            if len(seen) == nth:
                save(obj, f, *args, **kwargs)
                with open(f, "r+b") as handle:
                    handle.truncate(os.path.getsize(f) // 2)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return save(obj, f, *args, **kwargs)

    torch.save = patched


def slow(seconds: float) -> None:
    import time

    from megatron_loop.model.looplm import LoopLM

    forward = LoopLM.forward

    def patched(self, *args, **kwargs):
        if self.training:
            time.sleep(seconds)
        return forward(self, *args, **kwargs)

    LoopLM.forward = patched


def main() -> int:
    # the deepspeed launcher puts --local_rank=N first; pass it on to pretrain_loop.py
    launcher_args = [a for a in sys.argv[1:] if a.startswith("--local_rank")]
    rest = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    fault, argv = rest[0], launcher_args + rest[1:]
    kind, _, arg = fault.partition("@")
    if kind == "nan":
        accumulation, _, steps = arg.partition(":")
        inject_nan(int(accumulation), {int(s) for s in steps.split(",")})
    elif kind == "kill_before_publish":
        kill_before_publish(int(arg))
    elif kind == "enospc_on_save":
        enospc_on_save(int(arg))
    elif kind == "slow":
        slow(float(arg))
    else:
        raise SystemExit(f"unknown fault {fault!r}")
    import pretrain_loop

    return pretrain_loop.main(argv)


if __name__ == "__main__":
    sys.exit(main())
