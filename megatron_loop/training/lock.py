"""One run per output folder (the export's own lock, one export per export folder, is
:class:`megatron_loop.export.output_folder.ExportLock`; it shares the holder line written here).

Rank 0 holds ``{output_dir}/run.lock`` for the whole run: an exclusive ``flock`` on the file
(released by the kernel when the process ends, however it ends) and, inside, who holds it (host,
pid, start time, command) for the error a second run gets::

    error: runs/x/run.lock: train.output_dir is in use by another run (host node-3, pid 4242,
    started 2026-11-23T01:10:00Z): wait for it to end, stop it, or choose another train.output_dir

A run killed with ``kill -9`` leaves its holder line behind but no lock: the next run takes the
folder over and says so. On file systems where ``flock`` is not available, a holder on this host
is checked by its pid (and start time); a holder on another host is trusted (delete the file if
that run is gone). Taking the lock is also the writability check of ``output_dir``: it happens
before the model is built, so a read-only or full file system is one clear error.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from megatron_loop.atomic import process_alive
from megatron_loop.errors import LoopConfigError, LoopDataError, os_error_text

LOCK_NAME = "run.lock"


def holder_text(info: dict | None) -> str:
    if not info:  # it took the lock an instant ago and is writing its line
        return "a run that is just starting"
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}, started {info.get('started', '?')}"


def read_holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {"host": "?", "pid": "?", "started": "?"}


def write_holder(fd: int) -> None:
    now = time.time()
    info = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "started_epoch": now,
            "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    os.fsync(fd)


class RunLock:
    """``acquire`` before anything is written to ``output_dir``; ``release`` at the end."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_NAME
        self.fd: int | None = None
        self.created_dir = False
        self.taken_over: dict | None = None  # holder line of a run that died holding the folder
        self._inode: tuple[int, int] | None = None

    def acquire(self) -> "RunLock":
        out = self.output_dir
        key = f"train.output_dir={str(out)!r}"
        try:
            self.created_dir = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LoopDataError(f"{key}: cannot create the folder: {os_error_text(e)}; "
                                "expected a writable location") from None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            self._undo_dir()
            raise LoopDataError(f"{key}: not writable ({os_error_text(e)}: {self.path}); "
                                "expected a writable folder") from None
        holder = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder = read_holder(fd)
        except OSError as e:
            holder = read_holder(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise LoopConfigError(
                    f"{self.path}: train.output_dir is in use by another run ({holder_text(holder)}): "
                    "wait for it to end, stop it, or choose another train.output_dir") from None
            if holder and not self._holder_gone(holder):  # no flock on this file system
                os.close(fd)
                raise LoopConfigError(
                    f"{self.path}: train.output_dir is in use by another run ({holder_text(holder)}; this "
                    "file system has no flock, so a holder on another host is trusted: delete the file if "
                    "that run is gone): wait for it to end, stop it, or choose another train.output_dir") from None
        self.fd = fd
        self.taken_over = holder
        try:
            self.write_holder()
        except OSError as e:
            self.release()
            raise LoopDataError(f"{key}: not writable ({os_error_text(e)}: {self.path}); "
                                "expected a writable folder") from None
        st = os.fstat(fd)
        self._inode = (st.st_dev, st.st_ino)
        return self

    @staticmethod
    def _holder_gone(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False
        pid = holder.get("pid")
        return not (isinstance(pid, int) and process_alive(pid, holder.get("started_epoch")))

    def write_holder(self) -> None:
        write_holder(self.fd)

    def takeover_note(self) -> str | None:
        """What the holder line of a lock taken over says, in words (None: nothing taken over)."""
        if not self.taken_over:
            return None
        held = ", ".join(f"{k} {self.taken_over.get(k)}" for k in ("host", "pid", "started"))
        if self._holder_gone(self.taken_over):
            return f"{self.path}: taking over train.output_dir from a run that ended without releasing it ({held})"
        seen = "on another host: not checked" if self.taken_over.get("host") != socket.gethostname() else "alive"
        return (f"{self.path}: taking over train.output_dir: the lock file names {held} ({seen}) but no process "
                "holds its lock: the folder was copied from another run, or that run holds a copy elsewhere")

    def still_ours(self) -> bool:
        """False once the folder was deleted, moved or unmounted under the run."""
        if self._inode is None:
            return True
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._inode

    def release(self) -> None:
        """Clear the holder line and unlock; a folder this run created and left empty is removed
        (a run that failed before writing anything leaves nothing behind)."""
        if self.fd is None:
            return
        try:
            if self.still_ours():
                os.ftruncate(self.fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        self._undo_dir()

    def _undo_dir(self) -> None:
        if not self.created_dir:
            return
        try:
            if [p.name for p in self.output_dir.iterdir()] in ([], [LOCK_NAME]):
                self.path.unlink(missing_ok=True)
                self.output_dir.rmdir()
        except OSError:
            pass


def run_lock_holder(output_dir: Path) -> str | None:
    """Who holds ``output_dir/run.lock`` now (host, pid, start), or None when no live run holds
    it (no file, or a holder line left by a run that ended): a shared ``flock`` is refused while a
    run holds its exclusive one."""
    try:
        fd = os.open(Path(output_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return holder_text(read_holder(fd)) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
