"""Non-finite loss policy (``train.nan_policy``), on an injected NaN loss and on a real divergence.

``skip``: the update is skipped (DeepSpeed refuses a non-finite gradient norm), counted, logged
with the step and batch index, and training goes on; more than ``max_consecutive_nonfinite`` in a
row stops. ``stop``: the first one stops. A stop saves the last good state and exits 3 -- when the
weights still work (a bad batch); when an update blew them up, nothing is saved and the newest good
checkpoint is named, and the requeue resumes it (with a lower lr when asked). Saves during a streak
of skipped updates never remove the newest checkpoint from before it (training/divergence.py).
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

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


def test_saves_during_a_streak_of_skipped_updates_keep_the_checkpoint_from_before_it(tmp_path):
    """RELIABILITY.md row 70. ``keep_last: 1``, a save every step, NaN from step 3 on: before, the
    saves of steps 3 and 4 (same weights, updates skipped) pushed global_step2 out, the last
    checkpoint from before the streak; the stop at step 5 then saved the streak's state only."""
    run_dir = tmp_path / "run"
    result = _run(run_dir, "3,4,5", "train.nan_policy=skip", "train.max_consecutive_nonfinite=2",
                  "train.save_interval=1", "train.keep_last=1", "train.eval_interval=0")
    assert result.returncode == 3, result.stderr[-3000:]
    ckpt = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpt.glob("global_step*")) == ["global_step2", "global_step3", "global_step4"]
    assert (ckpt / "latest").read_text() == "global_step4"  # the stop's save: the weights of update 2, batch 5 next
    assert json.loads((ckpt / "divergence.json").read_text())["stops"][0]["saved"] == "global_step4"


@pytest.mark.timeout(400)
def test_a_divergence_saves_no_blown_up_weights_and_the_requeue_resumes_the_good_state(tmp_path):
    """RELIABILITY.md row 69 (issue 44 case 8). A resume in which update 11 blows the weights up (injected:
    every weight x inf before step 12's first forward, as a diverged update leaves them; ``train.lr`` is
    bounded at 1, so no config reaches it in a few steps), every gradient of step 12 infinite. Before, the stop
    saved them as "last good state" global_step11 and a requeue failed again at once. Now nothing is saved,
    the line names global_step10, and the requeue (the same command without the fault; here with
    ``train.divergence_lr_factor`` 0.5) resumes global_step10 at the lowered lr and trains to the end."""
    from megatron_loop.config import load_config

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run().run_dir, run_dir)
    ckpt = run_dir / "checkpoints"
    settings = load_config(reference_run().config).train
    lr = settings.lr
    sets = ["train.max_steps=14", "train.nan_policy=stop"]
    args = ["--config", str(reference_run().config), "--set", f"train.output_dir={run_dir}",
            *[a for o in sets for a in ("--set", o)]]
    first = run_cli(f"blowup@{ACCUMULATION}:2", *args, script=str(FAULTS))  # the 2nd step of the resume: 12
    assert first.returncode == 3, first.stderr[-3000:]
    errors = [line for line in first.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: non-finite loss/gradient norm at step 12 (train.nan_policy=stop); the weights had "
                      "diverged before it (non-finite on another batch too): nothing saved; the newest good "
                      f"checkpoint is {ckpt / 'global_step10'}"], first.stderr[-3000:]
    assert (ckpt / "latest").read_text() == "global_step10" and not (ckpt / "global_step11").exists()
    assert json.loads((ckpt / "divergence.json").read_text())["stops"][0] == {
        **json.loads((ckpt / "divergence.json").read_text())["stops"][0], "step": 12, "saved": None,
        "resume_from": "global_step10"}

    requeue = run_cli(*args, "--set", "train.divergence_lr_factor=0.5")
    assert requeue.returncode == 0, requeue.stderr[-3000:]
    assert (f"1 stop on non-finite values recorded in {ckpt / 'divergence.json'} (the last at step 12, resuming from "
            f"global_step10): training at train.lr={lr:g} x train.divergence_lr_factor=0.5^1 = {lr * 0.5:g}"
            ) in requeue.stderr
    assert f"resuming from {ckpt / 'global_step10'} (step 10" in requeue.stderr
    train = [r for r in records(run_dir, "train") if r["step"] > 10]
    assert [r["step"] for r in train][-4:] == [11, 12, 13, 14] and all(math.isfinite(r["loss"]) for r in train[-4:])
    # global_step10 ended the reference run's decay (at min_lr_ratio x peak); the extension continues the decay
    # from there (train.schedule_on_resume: continue_decay), now from the lowered peak
    assert abs(train[-4]["lr_muon"] - lr * 0.5 * settings.min_lr_ratio) < 1e-9 and (ckpt / "latest").read_text() == "global_step14"
