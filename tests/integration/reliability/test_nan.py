"""Non-finite loss policy (``train.nan_policy``), on an injected NaN loss.

``skip``: the update is skipped (DeepSpeed refuses a non-finite gradient norm), counted, logged
with the step and batch index, and training goes on; more than ``max_consecutive_nonfinite`` in a
row stops. ``stop``: the first one stops. A stop saves the last good state and exits 3.
"""

from __future__ import annotations

import pytest

import math

from train_fixtures import FAULTS, final_weights, records, reference_run, run_cli

pytestmark = pytest.mark.slow

ACCUMULATION = 4  # global 8 / (micro 2 x 1 rank)


def _run(run_dir, steps, *overrides):
    return run_cli(f"nan@{ACCUMULATION}:{steps}", "--config", str(reference_run().config),
                   "--set", f"train.output_dir={run_dir}", *[a for o in overrides for a in ("--set", o)],
                   script=str(FAULTS))


def _finite(weights):
    return all(bool(v.isfinite().all()) for v in weights.values())


def test_skip_counts_then_stops_after_too_many_in_a_row(tmp_path):
    run_dir = tmp_path / "run"
    result = _run(run_dir, "3,5,6", "train.nan_policy=skip", "train.max_consecutive_nonfinite=1")
    assert result.returncode == 3, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "step 6" in errors[0] and "max_consecutive_nonfinite=1" in errors[0]
    bad = records(run_dir, "nonfinite")
    assert [(r["step"], r["batch_index"], r["samples"]) for r in bad] == [(3, 2, [16, 24]), (5, 4, [32, 40]),
                                                                          (6, 5, [40, 48])]
    assert all(r["update_applied"] is False and math.isnan(r["loss"]) for r in bad)
    train = {r["step"]: r for r in records(run_dir, "train")}
    assert train[4]["update_applied"] is True and math.isfinite(train[4]["loss"])
    assert train[5]["skipped_updates"] == 2
    # last good state: the weights after step 4 (step 5 skipped), data position before batch 5
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "global_step5"
    assert _finite(final_weights(run_dir))


def test_stop_policy_saves_last_good_state(tmp_path):
    run_dir = tmp_path / "run"
    result = _run(run_dir, "2", "train.nan_policy=stop")
    assert result.returncode == 3
    assert "train.nan_policy=stop" in result.stderr
    assert [r["step"] for r in records(run_dir, "nonfinite")] == [2]
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step1"
    assert records(run_dir, "train")[0]["loss"] == records(reference_run().run_dir, "train")[0]["loss"]
    assert _finite(final_weights(run_dir))
