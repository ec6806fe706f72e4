"""Atomic, verified checkpoints, through the training CLI.

* a save interrupted between writing its shards and publishing leaves the previous checkpoint as
  ``latest``; the next start removes the partial folder, says where it resumes, and continues;
* a truncated shard is detected: ``--resume`` of that checkpoint fails naming the file, automatic
  resume falls back to the previous checkpoint (also past a ``latest`` holding garbage);
* a disk write failure during a save publishes nothing and leaves no partial folder; on one rank
  of two, every rank is told at once through the save's exchange and names the rank, the file
  and the condition (no wait for the collective timeout), and a torchrun restart resumes;
* a checkpoint carrying code is not unpickled.

The manifest's own checks are in tests/integration/training/test_checkpoint_format.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from data_fixtures import CodePayload
from megatron_loop.checkpoint.manifest import verify_checkpoint
from megatron_loop.checkpoint.selection import select_explicit
from megatron_loop.errors import LoopDataError
from testpaths import REPO
from train_fixtures import (FAULTS, assert_same_weights, check_ok, command, copy_run, env, final_weights, losses,
                            records, reference_run, run_cli)

pytestmark = pytest.mark.slow


def _common(run_dir):
    return ("--config", str(reference_run().config), "--set", f"train.output_dir={run_dir}")


def _error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def test_save_killed_before_publish_keeps_previous_latest(tmp_path):
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"
    killed = run_cli("kill_before_publish@2", *_common(run_dir), script=str(FAULTS))
    assert killed.returncode == -signal.SIGKILL
    assert (ckpt / "latest").read_text() == "global_step3"
    partial = ckpt / "global_step6.partial"
    assert (partial / "manifest.json").is_file()  # shards written and verified, not published
    assert not (ckpt / "global_step6").exists()
    with pytest.raises(LoopDataError, match=r"global_step6\.partial: an unpublished save"):
        select_explicit(partial)

    resumed = run_cli(*_common(run_dir))
    check_ok(resumed)
    assert f"resuming from {ckpt / 'global_step3'} (step 3" in resumed.stderr
    assert not partial.exists()
    assert losses(run_dir) == losses(reference_run().run_dir)


def test_truncated_shard_is_named_and_automatic_resume_falls_back(tmp_path):
    ref = reference_run()
    run_dir = copy_run(ref.run_dir, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    shard = next((ckpt / "global_step10").glob("*optim_states.pt"))
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 2)
    before = sorted(p.name for p in ckpt.iterdir())

    explicit = run_cli(*_common(run_dir), "--resume", str(ckpt / "global_step10"))
    assert explicit.returncode == 2
    (line,) = _error_lines(explicit)
    assert str(shard) in line and f"{size // 2} bytes, expected {size}" in line and "truncated" in line
    assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing written

    (ckpt / "latest").write_bytes(bytes(range(7, 200, 3)))  # and a garbage pointer (RELIABILITY.md row 41)
    automatic = run_cli(*_common(run_dir))
    check_ok(automatic)
    assert f"skipping checkpoint latest: {ckpt / 'latest'}: not a text file" in automatic.stderr
    assert f"skipping checkpoint global_step10: {shard}" in automatic.stderr
    assert f"resuming from {ckpt / 'global_step9'} (step 9" in automatic.stderr
    (aside,) = (ckpt / "set_aside").iterdir()  # the corrupt one is moved aside, never pruned in its place
    assert (aside / "global_step10" / shard.name).stat().st_size == size // 2
    verify_checkpoint(ckpt / "global_step10")  # re-saved whole
    assert losses(run_dir) == losses(ref.run_dir)
    assert_same_weights(final_weights(run_dir), final_weights(ref.run_dir))


def test_disk_full_during_save_publishes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"
    failed = run_cli("enospc_on_save@2", *_common(run_dir), script=str(FAULTS))
    assert failed.returncode == 2
    (line,) = _error_lines(failed)
    assert str(ckpt / "global_step6.partial") in line
    assert "no space left on device (ENOSPC)" in line and "the latest checkpoint is still global_step3" in line
    assert (ckpt / "latest").read_text() == "global_step3"
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["global_step3"]


@pytest.mark.distributed
def test_disk_full_on_one_rank_is_named_at_once_and_a_torchrun_restart_resumes(tmp_path):
    """ENOSPC half-way through rank 1's ZeRO-1 optimizer shard (2 ranks, ``torchrun --max-restarts
    1``, gloo): rank 1 does not leave DeepSpeed's save (its barrier) but tells the others through
    the save's one exchange; the attempt ends in seconds, not after train.collective_timeout_s,
    with ONE error line naming rank 1, the file and ENOSPC (before: rank 0 waited 600 s and blamed
    another rank, rank 1 printed gloo's "Application timeout caused pair closure"); nothing of the
    save is published. torchrun then restarts both ranks on the same port (the fault is injected
    in the first attempt only): they rendezvous afresh and resume from the latest checkpoint to
    the end (before: "Connect timeout" of gloo, reading the dead attempt's addresses)."""
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"
    cmd = command("enospc_on_save@1:2", *_common(run_dir), "--set", "train.save_interval=1", "--set",
                  "train.max_steps=4", "--set", "train.eval_interval=0", "--set", "train.collective_timeout_s=300",
                  nproc=2, launcher="torchrun", script=str(FAULTS))
    cmd[1:1] = ["--max-restarts", "1"]
    start = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - start
    partial = ckpt / "global_step2.partial"
    assert _error_lines(result) == [
        f"error: {partial}: writing the checkpoint failed (rank 1: no space left on device (ENOSPC): "
        f"{partial / 'zero_pp_rank_1_mp_rank_00_optim_states.pt'}); nothing was published, the latest checkpoint "
        "is still global_step1"], result.stderr[-4000:]
    assert "pair closure" not in result.stderr and "LoopDataError" not in result.stderr
    assert elapsed < 290, elapsed  # both attempts together: below the 300 s the first one used to wait
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resuming from {ckpt / 'global_step1'} (step 1" in result.stderr
    resumes = records(run_dir, "resume")
    assert [r["step"] for r in resumes] == [1] and records(run_dir, "summary")[-1]["step"] == 4
    assert (ckpt / "latest").read_text() == "global_step4" and not partial.exists()


def test_tampered_checkpoint_is_not_unpickled(tmp_path):
    """Security: DeepSpeed's own reader is switched to weights_only=True, so a
    checkpoint carrying code (with a manifest rewritten to match) fails to load instead of running it."""
    import hashlib

    import torch

    run_dir = copy_run(reference_run().run_dir, tmp_path / "run")
    tag = run_dir / "checkpoints" / "global_step10"
    marker = tmp_path / "pwned"
    target = tag / "mp_rank_00_model_states.pt"
    torch.save({"module": CodePayload(str(marker))}, target)
    manifest = json.loads((tag / "manifest.json").read_text())
    manifest["files"][target.name] = {"size": target.stat().st_size,
                                      "sha256": hashlib.sha256(target.read_bytes()).hexdigest()}
    (tag / "manifest.json").write_text(json.dumps(manifest))

    result = run_cli(*_common(run_dir), "--resume", str(tag))
    assert result.returncode == 2
    (line,) = _error_lines(result)
    assert f"{tag}: DeepSpeed could not load the checkpoint (UnpicklingError" in line
    assert not marker.exists()
