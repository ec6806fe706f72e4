"""``training/signals.py``: stop requests collected by flags and agreed on by one reduction (the runs that
are stopped by them: tests/integration/reliability/test_signals.py). The reduction is passed in, so the
agreement of several ranks is checked here with an element-wise max over fake peers' flags."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from megatron_loop.training.signals import (LAUNCHER_GONE, OUTPUT_GONE, REASONS, WALL_TIME, StopController,
                                            protect_loader_workers, ignore_stop_signals_in_worker)


def _local(flags):
    return flags


def test_no_request_no_stop():
    ctl = StopController(None, reduce=_local)
    assert ctl.poll(0.5) is None
    assert ctl.poll(100.0) is None  # no wall-time limit: a step's length alone never stops


def test_wall_time_stops_before_the_step_that_would_cross_it():
    start = time.monotonic() - 10.0
    ctl = StopController(12.0, start_time=start, reduce=_local)
    assert ctl.poll(1.0) is None  # 10 s elapsed + 1 s step < 12 s
    assert ctl.poll(2.5) == WALL_TIME  # the longest step seen (2.5 s) would cross 12 s
    ctl = StopController(12.0, start_time=start, reduce=_local)
    ctl.poll(3.0)
    assert ctl.poll(0.1) == WALL_TIME  # the longest step is remembered, not the last one


def test_a_flag_raised_by_one_rank_stops_every_rank():
    peer = [0.0] * len(REASONS)
    peer[REASONS.index(LAUNCHER_GONE)] = 1.0
    ctl = StopController(None, reduce=lambda mine: [max(a, b) for a, b in zip(mine, peer)])
    assert ctl.poll(0.1) == LAUNCHER_GONE


def test_checks_are_polled_and_the_first_reason_in_order_wins():
    gone = {"launcher": False}
    ctl = StopController(None, reduce=_local, checks={LAUNCHER_GONE: lambda: gone["launcher"]})
    assert ctl.poll(0.1) is None
    gone["launcher"] = True
    ctl.add_check(OUTPUT_GONE, lambda: True)
    assert ctl.poll(0.1) == OUTPUT_GONE  # listed first in REASONS: it stops without a save
    assert REASONS[0] == OUTPUT_GONE


def test_sigterm_sets_the_flag_and_uninstall_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    ctl = StopController(None, reduce=_local).install()
    try:
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # plain python: Ctrl-C unchanged
        os.kill(os.getpid(), signal.SIGTERM)
        assert ctl.poll(0.1) == "SIGTERM"
    finally:
        ctl.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigint_under_a_launcher_stops_then_a_second_one_interrupts():
    ctl = StopController(None, reduce=_local).install(sigint=True)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert ctl.poll(0.1) == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs at the next bytecode boundary
    finally:
        ctl.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_loader_workers_ignore_stop_signals():
    with_workers = SimpleNamespace(num_workers=2, worker_init_fn=None)
    in_process = SimpleNamespace(num_workers=0, worker_init_fn=None)
    protect_loader_workers(with_workers, in_process, None)
    assert with_workers.worker_init_fn is ignore_stop_signals_in_worker
    assert in_process.worker_init_fn is None  # no worker process: the main process's handlers apply
