"""Preemption and crashes.

A real subprocess run stopped by SIGTERM saves and exits 0, a wall-time limit does the same,
and one killed with SIGKILL mid-run resumes; both continue exactly (loss trajectory and final
weights bitwise on CPU fp32, data order included) as the uninterrupted reference run.
Runs are slowed down (``faults.py slow@...``) so that the signal lands mid-run.
"""

from __future__ import annotations

import pytest

import os
import signal

from train_fixtures import (FAULTS, assert_same_weights, check_ok, final_weights, losses, records,
                            reference_run, run_cli, start_cli, wait_for_step)

pytestmark = pytest.mark.slow


def _common(run_dir):
    return ("--config", str(reference_run().config), "--set", f"train.output_dir={run_dir}")


def test_sigterm_and_wall_time_save_then_resume_exactly(tmp_path):
    ref = reference_run()
    run_dir = tmp_path / "run"
    proc = start_cli("slow@0.3", *_common(run_dir), script=str(FAULTS))
    wait_for_step(proc, run_dir, 2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    stop = records(run_dir, "stop")[-1]
    assert stop["reason"] == "SIGTERM" and 2 <= stop["step"] < 10
    assert (run_dir / "checkpoints" / "latest").read_text() == f"global_step{stop['step']}"
    assert f"stopping after step {stop['step']} (SIGTERM)" in out

    walled = run_cli(*_common(run_dir), "--set", "train.wall_time_limit_s=0.001")
    check_ok(walled)
    wall = records(run_dir, "stop")[-1]
    assert wall["reason"] == "wall-time limit" and wall["step"] == stop["step"] + 1

    check_ok(run_cli(*_common(run_dir)))
    assert losses(run_dir) == losses(ref.run_dir)
    assert_same_weights(final_weights(run_dir), final_weights(ref.run_dir))


def test_sigkill_mid_run_resumes_exactly(tmp_path):
    ref = reference_run()
    run_dir = tmp_path / "run"
    proc = start_cli("slow@0.3", *_common(run_dir), script=str(FAULTS))
    wait_for_step(proc, run_dir, 5)  # past the checkpoint of step 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = run_cli(*_common(run_dir))
    check_ok(resumed)
    assert "resuming from" in resumed.stderr
    assert records(run_dir, "resume")[0]["step"] in (3, 6)
    assert losses(run_dir) == losses(ref.run_dir)  # replayed steps replaced, not duplicated
    assert_same_weights(final_weights(run_dir), final_weights(ref.run_dir))


def test_sigusr1_requests_a_stop_on_every_rank():
    from megatron_loop.training.signals import REASONS, StopController

    seen = []
    previous = signal.getsignal(signal.SIGUSR1)
    stopper = StopController(None, reduce=lambda flags: seen.append(flags) or flags).install()
    try:
        assert stopper.poll(0.1) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stopper.poll(0.1) == "SIGUSR1"
    finally:
        stopper.uninstall()
    raised = [float(reason == "SIGUSR1") for reason in REASONS]
    assert seen == [[0.0] * len(REASONS), raised]  # the flags go through the all-reduce
    assert signal.getsignal(signal.SIGUSR1) == previous  # handlers are restored
