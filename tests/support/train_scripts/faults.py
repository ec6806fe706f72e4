"""``pretrain_loop.py`` (or ``tools/convert_to_hf.py``) with injected faults, for the reliability
tests (docs/RELIABILITY.md).

    python tests/support/train_scripts/faults.py FAULT[+FAULT...] [pretrain_loop.py arguments]
    python tests/support/train_scripts/faults.py FAULT TOOL.py [arguments of tools/TOOL.py]

FAULT is one of
  nan@A:S1,S2,...        the training loss of optimizer steps S1, S2, ... becomes NaN
                         (A: micro-batches per step on this rank, i.e. accumulation steps)
  blowup@A:S             before the first forward of optimizer step S, every weight is multiplied by
                         inf in place: what an update that diverged leaves (train.lr is bounded at 1,
                         so no config reaches it in a few steps); steps counted in this process
  kill_before_publish@N  SIGKILL this process on the N-th save, after every shard is written
                         and verified but before the checkpoint is published
  enospc_on_save@[RANK:]N  the N-th save (of rank RANK only, if given) fails with "No space left
                         on device" half-way through its first shard (torch.save, as DeepSpeed calls it)
  slow@SECONDS           every training forward sleeps SECONDS (time to deliver a signal mid-run)
  oserror@NAME:PATH      every open/mkdir of PATH or a path under it fails with errno NAME
                         (EROFS: a read-only mount, EACCES: no permission, ENOSPC: a full disk)
  fsize@BYTES            the process may not write files larger than BYTES (RLIMIT_FSIZE; the
                         kernel then fails the write with EFBIG, as it fails a full disk with ENOSPC)
  stall@RANK:N           rank RANK stops itself (SIGSTOP) before its N-th training forward in this
                         process: a stopped, not killed, rank
  raise@[RANK:]N         the N-th training forward (of rank RANK only, if given) raises a plain
                         RuntimeError (a bug in a step)
  worker@SIGNAL:N        the DataLoader worker sends itself SIGNAL (STOP: hung, KILL: what the
                         out-of-memory killer sends) as it reads its N-th sample
  metrics@full:N         after the N-th train record, metrics.jsonl writes fail with ENOSPC (the
                         appends go to /dev/full, as to a full disk: the flush and the close fail)
  metrics@remove:N       after the N-th train record, metrics.jsonl is deleted (rm under a run)
  data@truncate:N        after the N-th train record, the first train prefix's P.bin is truncated to
                         half its size in place (a file copied over, data preprocessed again in place)
  shm_full               /dev/shm is full: no room for the DataLoader workers' batches, and creating
                         their queues' semaphores fails with ENOSPC
  kill_in_swap           SIGKILL an HF export right after its old folder was moved aside, before
                         the new one is renamed into place
  universal_full@N       the disk fills at the N-th file of a universal conversion (a resume on
                         another number of ranks): that file is half written, torch reports
                         "enforce fail", and every later write under the checkpoint folder fails
                         with ENOSPC (removing files still works, as on a full disk)
  config@RANK:KEY=VALUE  rank RANK runs with --set KEY=VALUE added (a node with an edited YAML)
  slow_encode@SECONDS    every encode batch of tools/preprocess_data.py sleeps SECONDS (in its
                         worker processes too: time to interrupt it mid-run)

Under ``torchrun --max-restarts``, faults are injected in the first attempt only.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support
from testpaths import REPO  # noqa: E402

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


def inject_blowup(accumulation: int, at_step: int) -> None:
    import torch

    from megatron_loop.model.looplm import LoopLM

    forward = LoopLM.forward
    bump = _counter()

    def patched(self, *args, **kwargs):
        if self.training:
            n = bump()
            if n == (at_step - 1) * accumulation + 1:
                with torch.no_grad():
                    for param in self.parameters():
                        param.mul_(float("inf"))
        return forward(self, *args, **kwargs)

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


def enospc_on_save(rank: int | None, nth: int) -> None:
    """The first file of the nth checkpoint is half written, then the disk is full."""
    import torch

    if rank is not None and int(os.environ.get("RANK", "0")) != rank:
        return
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


def oserror(name: str, prefix: str) -> None:
    """Fail opening or creating anything at or under ``prefix`` as a read-only / full / forbidden
    file system would (the Python-level calls our code and the libraries use to write files)."""
    import builtins
    import io

    code = getattr(errno, name)
    prefix = os.path.abspath(prefix)

    def hit(path) -> bool:
        try:
            path = os.path.abspath(os.fspath(path))
        except TypeError:  # a file descriptor
            return False
        return path == prefix or path.startswith(prefix + os.sep)

    def refuse(path):
        raise OSError(code, os.strerror(code), os.fspath(path))

    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

    def patched_open(file, mode="r", *args, **kwargs):
        if hit(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def patched_os_open(path, flags, *args, **kwargs):
        if hit(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def patched_mkdir(path, *args, **kwargs):
        if hit(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    builtins.open = io.open = patched_open
    os.open, os.mkdir = patched_os_open, patched_mkdir


def fsize(limit: int) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead of EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def stall(rank: int, nth: int) -> None:
    from megatron_loop.model.looplm import LoopLM

    if int(os.environ.get("RANK", "0")) != rank:
        return
    forward = LoopLM.forward
    bump = _counter()

    def patched(self, *args, **kwargs):
        if self.training and bump() == nth:
            os.kill(os.getpid(), signal.SIGSTOP)
        return forward(self, *args, **kwargs)

    LoopLM.forward = patched


def raise_in_step(rank: int | None, nth: int) -> None:
    from megatron_loop.model.looplm import LoopLM

    if rank is not None and int(os.environ.get("RANK", "0")) != rank:
        return
    forward = LoopLM.forward
    bump = _counter()

    def patched(self, *args, **kwargs):
        if self.training and bump() == nth:
            raise RuntimeError(f"injected fault in training forward {nth}")
        return forward(self, *args, **kwargs)

    LoopLM.forward = patched


def signal_in_worker(name: str, nth: int) -> None:
    import torch.utils.data

    from megatron_loop.data.packed import PackedDataset

    getitem = PackedDataset.__getitem__
    bump = _counter()

    def patched(self, index):
        if torch.utils.data.get_worker_info() is not None and bump() == nth:
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
        return getitem(self, index)

    PackedDataset.__getitem__ = patched


class FullDiskFile:
    """A text file on a full disk: writes are buffered, then every flush fails with ENOSPC, and so
    does the close (which flushes the buffer again), as Python's buffered files behave."""

    def __init__(self, real) -> None:
        self.real, self.pending = real, []

    def fileno(self) -> int:
        return self.real.fileno()

    def write(self, text: str) -> int:
        self.pending.append(text)
        return len(text)

    def _fail(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        self._fail()

    def close(self) -> None:
        self.real.close()
        if self.pending:
            self._fail()


def metrics_fault(how: str, nth: int) -> None:
    from megatron_loop.training.metrics import MetricsLogger

    log = MetricsLogger.log
    bump = _counter()

    def patched(self, record):
        log(self, record)
        if record.get("event") == "train" and bump() == nth:
            if how == "full":
                self._file = FullDiskFile(self._file)
            else:
                os.unlink(self.path)

    MetricsLogger.log = patched


def truncate_data(nth: int) -> None:
    from megatron_loop.training.metrics import MetricsLogger

    log = MetricsLogger.log
    bump = _counter()

    def patched(self, record):
        log(self, record)
        if record.get("event") == "train" and bump() == nth:
            path = self.cfg.data.train_prefixes[0] + ".bin"
            os.truncate(path, os.path.getsize(path) // 2)

    MetricsLogger.log = patched


def shm_full() -> None:
    import multiprocessing.synchronize
    import shutil

    usage = shutil.disk_usage

    def patched_usage(path):
        if os.fspath(path).rstrip("/") == "/dev/shm":
            total = 64 << 20
            return type(usage("/"))(total, total, 0)
        return usage(path)

    def no_room(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # sem_open in a full /dev/shm: no file name

    shutil.disk_usage = patched_usage
    multiprocessing.synchronize.SemLock.__init__ = no_room


def kill_in_swap() -> None:
    real_replace = os.replace

    def patched(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if ".old-" in os.path.basename(os.fspath(dst)):
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = patched


def universal_full(nth: int) -> None:
    import torch

    save = torch.save
    bump = _counter()

    def patched(obj, f, *args, **kwargs):
        parts = Path(str(f)).parents
        partial = next((p for p in parts if p.name.endswith(".universal.partial")), None)
        if partial is not None and bump() == nth:
            save(obj, f, *args, **kwargs)
            with open(f, "r+b") as handle:
                handle.truncate(os.path.getsize(f) // 2)
            oserror("ENOSPC", str(partial.parent))  # the checkpoint folder's disk is full from now on
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4242")
        return save(obj, f, *args, **kwargs)

    torch.save = patched


def slow_encode(seconds: float) -> None:
    import time

    from megatron_loop.data import preprocess

    encode = preprocess.encode_batch

    def patched(texts):
        time.sleep(seconds)
        return encode(texts)

    # the pool pickles the function by name: under the patched function's own name it resolves to
    # itself, in the forked workers too
    patched.__module__, patched.__qualname__ = preprocess.__name__, "encode_batch"
    preprocess.encode_batch = patched  # read at call time


def apply(fault: str) -> None:
    kind, _, arg = fault.partition("@")
    if kind == "nan":
        accumulation, _, steps = arg.partition(":")
        inject_nan(int(accumulation), {int(s) for s in steps.split(",")})
    elif kind == "blowup":
        accumulation, _, step = arg.partition(":")
        inject_blowup(int(accumulation), int(step))
    elif kind == "kill_before_publish":
        kill_before_publish(int(arg))
    elif kind == "enospc_on_save":
        rank, _, nth = arg.rpartition(":")
        enospc_on_save(int(rank) if rank else None, int(nth))
    elif kind == "slow":
        slow(float(arg))
    elif kind == "oserror":
        name, _, path = arg.partition(":")
        oserror(name, path)
    elif kind == "fsize":
        fsize(int(arg))
    elif kind == "stall":
        rank, _, nth = arg.partition(":")
        stall(int(rank), int(nth))
    elif kind == "raise":
        rank, _, nth = arg.rpartition(":")
        raise_in_step(int(rank) if rank else None, int(nth))
    elif kind == "worker":
        name, _, nth = arg.partition(":")
        signal_in_worker(name, int(nth))
    elif kind == "metrics":
        how, _, nth = arg.partition(":")
        metrics_fault(how, int(nth))
    elif kind == "data":
        how, _, nth = arg.partition(":")
        assert how == "truncate", fault
        truncate_data(int(nth))
    elif kind == "shm_full":
        shm_full()
    elif kind == "kill_in_swap":
        kill_in_swap()
    elif kind == "universal_full":
        universal_full(int(arg))
    elif kind == "slow_encode":
        slow_encode(float(arg))
    else:
        raise SystemExit(f"unknown fault {fault!r}")


def main() -> int:
    # the deepspeed launcher puts --local_rank=N first; pass it on to pretrain_loop.py
    launcher_args = [a for a in sys.argv[1:] if a.startswith("--local_rank")]
    rest = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    faults, argv = rest[0], launcher_args + rest[1:]
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":  # a torchrun restart runs clean
        for fault in faults.split("+"):
            kind, _, arg = fault.partition("@")
            if kind == "config":  # this rank's own --set: changes the arguments, not the code
                rank, _, setting = arg.partition(":")
                argv += ["--set", setting] if int(os.environ.get("RANK", "0")) == int(rank) else []
                continue
            apply(fault)
    if argv and argv[0].endswith(".py") and (REPO / "tools" / argv[0]).is_file():  # a tool, as its CLI runs it
        import runpy

        sys.path.insert(0, str(REPO / "tools"))
        sys.argv = [str(REPO / "tools" / argv[0]), *argv[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")  # exits through its sys.exit(run_cli(main))
        return 0
    import pretrain_loop

    return pretrain_loop.main(argv)


if __name__ == "__main__":
    sys.exit(main())
