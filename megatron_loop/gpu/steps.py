"""Steps under time limits that end their whole process tree, each result recorded the moment it exists.

A step runs as the leader of a process group of its own (``Popen(process_group=0)``), so its whole
tree -- the deepspeed runner, its worker, the worker's compile threads -- is one group: at the limit
``os.killpg`` sends the group SIGTERM, then, after :attr:`Runner.grace_s`, SIGKILL, whether or not the
step's first process is still there (the deepspeed runner dies at once on SIGTERM while its worker
traps it to save; a watchdog on the runner alone never sends the KILL, and the next step would start
beside the last one's GPU memory). A step that ends by itself but leaves processes behind has them
ended the same way. If the driver is stopped (SIGTERM, SIGINT, SIGHUP), the running step's group is
ended first. A group, not a session of its own (``start_new_session``, used only on Python 3.10,
which lacks ``process_group``): the device ends what a command leaves running when it returns, except
processes in another session, so a driver killed outright leaves no training worker holding the GPU
into the next command.

``steps.tsv`` holds one line per step: id, status, exit code, seconds, limit, command (the reports read it).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

TIMED_OUT = 124  # the exit code a step ended at its limit is recorded with (as timeout(1) has it)
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live (not zombie) member."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: ask the kernel (zombies count as alive)
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def end_group(pgid: int, grace_s: float, log: Callable[[str], None]) -> bool:
    """SIGTERM to the group, ``grace_s`` seconds, then SIGKILL until none is left; False if some remain."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), *[(signal.SIGKILL, 2.0)] * 5):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        until = time.monotonic() + wait_s
        while group_alive(pgid):
            if time.monotonic() >= until:
                break
            time.sleep(0.1)
        else:
            return True
        if sig == signal.SIGTERM:
            log(f"step processes still running {grace_s:g} s after SIGTERM: SIGKILL to process group {pgid}")
    log(f"step processes left after SIGKILL in process group {pgid}")
    return False


class Runner:
    """Runs a session's steps one after another under its budget; ``steps.tsv`` and ``logs/ID.log`` in
    the folders given. ``cap_scale`` multiplies every step's cap (a loaded CPU in the smoke runs);
    ``stream``: copy each step's output to stdout while it runs (the device's output tail shows it)."""

    def __init__(self, name: str, steps_tsv: Path, logs: Path, budget_s: float, reserve_s: float,
                 min_step_s: float, cap_scale: float = 1.0, stream: bool = True, grace_s: float = 10.0,
                 only: Sequence[str] = ()):
        self.name, self.steps_tsv, self.logs = name, steps_tsv, logs
        self.budget_s, self.reserve_s, self.min_step_s = budget_s, reserve_s, min_step_s
        self.cap_scale, self.stream, self.grace_s, self.only = cap_scale, stream, grace_s, tuple(only)
        self.start = time.time()
        self.running: int | None = None  # the process group of the step running now
        self.train_failed: str | None = None  # the first training step that failed (fail-fast)
        self.statuses: dict[str, str] = {}
        logs.mkdir(parents=True, exist_ok=True)
        steps_tsv.write_text("")

    # ------------------------------------------------------------------ bookkeeping
    def log(self, message: str) -> None:
        print(f"[{self.name} {time.strftime('%H:%M:%S', time.gmtime())} +{time.time() - self.start:.0f}s] {message}",
              flush=True)

    def left(self) -> float:
        return self.start + self.budget_s - self.reserve_s - time.time()

    def record(self, sid: str, status: str, rc: int | str = "", wall_s: float = 0, limit_s: float = 0,
               command: str = "") -> None:
        """One line of steps.tsv, appended at once (a killed session keeps what it recorded)."""
        command = " ".join(command.replace("\t", " ").splitlines())
        with self.steps_tsv.open("a") as f:
            f.write(f"{sid}\t{status}\t{rc}\t{wall_s:.1f}\t{limit_s:.0f}\t{command}\n")
        self.statuses[sid] = status

    def failed(self) -> bool:
        return any(s in ("failed", "timed out") for s in self.statuses.values())

    def enough_time(self, sid: str, need_s: float) -> bool:
        """True if ``need_s`` (x cap_scale) seconds are left; else ``sid`` is recorded as skipped."""
        need, left = need_s * self.cap_scale, self.left()
        if left >= need:
            return True
        self.log(f"{sid}: skipped (out of time: {left:.0f} s left, it needs {need:.0f} s to give a figure)")
        self.record(sid, f"skipped: out of time ({left:.0f} s left, needs {need:.0f} s)")
        return False

    # ------------------------------------------------------------------ running
    def step(self, sid: str, cap_s: float, command: Sequence[str], show: str | None = None,
             env: dict[str, str] | None = None) -> bool:
        """``command`` under its limit (cap_s x cap_scale, bounded by what is left), output in logs/ID.log;
        True if it succeeded or did not run (not selected, out of time)."""
        shown = show if show is not None else shlex.join(command)
        if self.only and sid not in self.only:
            self.record(sid, "skipped: not selected", command=shown)
            return True
        limit = min(cap_s * self.cap_scale, self.left())
        if limit < self.min_step_s:
            self.log(f"{sid}: skipped (out of time: {limit:.0f} s left)")
            self.record(sid, "skipped: out of time", command=shown)
            return True
        self.log(f"{sid} (limit {limit:.0f} s): {shown}")
        t0 = time.monotonic()
        rc = self._bounded(limit, self.logs / f"{sid}.log", command, env)
        status = {0: "ok", TIMED_OUT: "timed out"}.get(rc, "failed")
        wall = time.monotonic() - t0
        self.log(f"{sid}: {status} (exit code {rc}, {wall:.1f} s)")
        self.record(sid, status, rc, wall, limit, shown)
        return rc == 0

    def train(self, sid: str, cap_s: float, command: Sequence[str], **kw) -> bool:
        """:meth:`step`, unless a training step failed before (fail-fast)."""
        if self.train_failed:
            self.log(f"{sid}: skipped (fail-fast: training step {self.train_failed} failed)")
            self.record(sid, f"skipped: training step {self.train_failed} failed (fail-fast)",
                        command=shlex.join(command))
            return False
        if self.step(sid, cap_s, command, **kw):
            return True
        self.train_failed = sid
        return False

    def _bounded(self, limit: float, log_path: Path, command: Sequence[str], env: dict[str, str] | None) -> int:
        with open(log_path, "wb") as log, open(log_path, "rb") as tail:
            try:
                proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, **OWN_GROUP)
            except OSError as e:  # a command that does not exist: a failed step, its reason in its log
                log.write(f"error: cannot start {command[0]}: {e.strerror or e}\n".encode())
                log.flush()
                self._copy(tail)
                return 127
            self.running = proc.pid
            deadline = time.monotonic() + limit
            rc = None
            while rc is None and time.monotonic() < deadline:
                self._copy(tail)
                try:
                    rc = proc.wait(timeout=0.25)
                except subprocess.TimeoutExpired:
                    pass
            if rc is None:
                self.log(f"limit of {limit:.0f} s reached: ending the step's processes (SIGTERM, then SIGKILL "
                         f"after {self.grace_s:g} s)")
                end_group(proc.pid, self.grace_s, self.log)
                proc.wait()
                rc = TIMED_OUT
            elif group_alive(proc.pid):
                self.log(f"the step exited (code {rc}) but left processes in its group {proc.pid}; ending them")
                end_group(proc.pid, self.grace_s, self.log)
            self.running = None
            self._copy(tail)
        return rc

    def _copy(self, tail) -> None:
        if self.stream:
            chunk = tail.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()

    def stop_running(self) -> None:
        """End the running step's group (the driver is stopping)."""
        if self.running is not None:
            end_group(self.running, 2.0, self.log)
            self.running = None

    def on_signals(self) -> None:
        """SIGTERM, SIGINT, SIGHUP: end the running step, exit 143."""
        def stop(signum, frame):
            self.log("stopped by a signal: ending the running step")
            self.stop_running()
            sys.exit(143)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)
