"""Graceful stop: SIGTERM / SIGUSR1 (SLURM preemption) and a wall-time limit (issue 9 item 1).

A handler only sets a flag; the loop asks :meth:`StopController.poll` after every optimizer step.
``poll`` is collective (one all-reduce of three flags) so every rank stops after the SAME step,
then the loop saves a checkpoint and exits 0 (as Megatron-LM's ``--exit-signal-handler`` and
torchtitan do). A signal that only reached some ranks still stops all of them.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from megatron_loop.training.distributed import all_reduce_max

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
REASONS = ("SIGTERM", "SIGUSR1", "wall-time limit")


class StopController:
    """Collects stop requests; ``poll`` returns the agreed reason (or None) on every rank."""

    def __init__(self, wall_time_limit_s: float | None, start_time: float | None = None,
                 reduce: Callable[[list[float]], list[float]] = all_reduce_max) -> None:
        self.wall_time_limit_s = wall_time_limit_s
        self.start_time = time.monotonic() if start_time is None else start_time
        self._flags = [0.0, 0.0, 0.0]
        self._reduce = reduce
        self._previous: dict[int, object] = {}
        self._longest_step_s = 0.0

    def install(self) -> "StopController":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:  # noqa: ARG002 - signal handler signature
        self._flags[0 if signum == signal.SIGTERM else 1] = 1.0

    def poll(self, last_step_s: float) -> str | None:
        """After a step: stop if a signal arrived anywhere, or if one more step of the longest
        duration seen so far would cross the wall-time limit (the save must still fit)."""
        self._longest_step_s = max(self._longest_step_s, last_step_s)
        if self.wall_time_limit_s is not None:
            elapsed = time.monotonic() - self.start_time
            if elapsed + self._longest_step_s >= self.wall_time_limit_s:
                self._flags[2] = 1.0
        flags = self._reduce(list(self._flags))
        for flag, reason in zip(flags, REASONS):
            if flag:
                return reason
        return None
