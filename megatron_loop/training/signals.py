"""Graceful stop: signals, a vanished launcher, wall time, a vanished output folder
(docs/RELIABILITY.md lists each case with its test).

A handler only sets a flag; the loop asks :meth:`StopController.poll` after every optimizer step.
``poll`` is collective (one all-reduce of the flags) so every rank stops after the SAME step;
the loop then saves a checkpoint and exits 0 (as Megatron-LM's ``--exit-signal-handler`` and
torchtitan do). A condition seen by one rank stops all of them.

* ``SIGTERM`` / ``SIGUSR1`` (scancel, SLURM ``--signal``, systemd, the launchers forwarding them)
  and ``SIGHUP`` (the ssh session of an interactive launch dropped; torchrun forwards it).
* ``SIGINT`` under a launcher (``torchrun`` or ``deepspeed``: they forward it, and Ctrl-C in their
  terminal reaches the whole group): the same stop, so that interrupting a launcher checkpoints as
  a SIGTERM does; a second SIGINT stops at once. Under plain ``python`` Ctrl-C keeps Python's
  meaning (``KeyboardInterrupt``: stop at once without saving, exit 130).
  The handlers are installed before the DataLoader workers fork, and the workers ignore
  SIGTERM/SIGUSR1/SIGINT (:func:`ignore_stop_signals_in_worker`): a signal sent to the whole
  process group reaches them too, and a worker killed by it would end the run without a save.
* The launcher vanished (:func:`megatron_loop.training.distributed.launcher_processes`): a
  launcher that does not forward a signal dies of it (torchrun and SIGUSR1, the ``deepspeed``
  runner and SIGTERM) or is killed with ``kill -9``; its ranks notice at the next step, save and
  exit instead of training on unattended.
* ``train.wall_time_limit_s``: stop when one more step of the longest duration seen would cross it.
* The output folder vanished (deleted, moved or unmounted; rank 0 checks its lock file): stop
  without saving (a save would recreate the folder elsewhere) and report it as an error.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from megatron_loop.training.distributed import all_reduce_max

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
WORKER_IGNORED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
SIGNAL_REASONS = {signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1", signal.SIGHUP: "SIGHUP",
                  signal.SIGINT: "SIGINT"}
WALL_TIME = "wall-time limit"
LAUNCHER_GONE = "launcher exited"
OUTPUT_GONE = "output folder vanished"
REASONS = (OUTPUT_GONE, "SIGTERM", "SIGUSR1", "SIGHUP", "SIGINT", WALL_TIME, LAUNCHER_GONE)  # first set wins
ERROR_REASONS = (OUTPUT_GONE,)  # stop without a checkpoint, exit with an error


def ignore_stop_signals_in_worker(worker_id: int) -> None:  # noqa: ARG001 - worker_init_fn signature
    """DataLoader ``worker_init_fn``: the main process decides when to stop; a group signal must
    not kill the worker it reaches (torch would then raise "DataLoader worker ... killed by signal")."""
    for sig in WORKER_IGNORED:
        signal.signal(sig, signal.SIG_IGN)


def protect_loader_workers(*loaders) -> None:
    """Make every worker of ``loaders`` ignore stop signals (set before the workers start)."""
    for loader in loaders:
        if loader is not None and loader.num_workers > 0:
            loader.worker_init_fn = ignore_stop_signals_in_worker


class StopController:
    """Collects stop requests; ``poll`` returns the agreed reason (or None) on every rank.

    ``checks``: extra local conditions, ``reason -> callable returning True to stop`` (launcher
    vanished, output folder vanished), evaluated at every poll.
    """

    def __init__(self, wall_time_limit_s: float | None, start_time: float | None = None,
                 reduce: Callable[[list[float]], list[float]] = all_reduce_max,
                 checks: dict[str, Callable[[], bool]] | None = None) -> None:
        self.wall_time_limit_s = wall_time_limit_s
        self.start_time = time.monotonic() if start_time is None else start_time
        self._flags = [0.0] * len(REASONS)
        self._reduce = reduce
        self._checks = dict(checks or {})
        self._previous: dict[int, object] = {}
        self._longest_step_s = 0.0

    def install(self, sigint: bool = False) -> "StopController":
        """``sigint``: SIGINT is a stop request too (under a launcher)."""
        for sig in STOP_SIGNALS + ((signal.SIGINT,) if sigint else ()):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def add_check(self, reason: str, check: Callable[[], bool]) -> None:
        self._checks[reason] = check

    def _handle(self, signum: int, frame) -> None:  # noqa: ARG002 - signal handler signature
        index = REASONS.index(SIGNAL_REASONS[signum])
        if signum == signal.SIGINT and self._flags[index]:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self._flags[index] = 1.0

    def poll(self, last_step_s: float) -> str | None:
        """After a step: the first reason any rank has to stop, or None."""
        self._longest_step_s = max(self._longest_step_s, last_step_s)
        if self.wall_time_limit_s is not None:
            elapsed = time.monotonic() - self.start_time
            if elapsed + self._longest_step_s >= self.wall_time_limit_s:
                self._flags[REASONS.index(WALL_TIME)] = 1.0
        for reason, check in self._checks.items():
            if check():
                self._flags[REASONS.index(reason)] = 1.0
        flags = self._reduce(list(self._flags))
        for flag, reason in zip(flags, REASONS):
            if flag:
                return reason
        return None
