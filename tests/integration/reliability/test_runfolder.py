"""The run folder, in process: the lock and its stale holder, branches and retention, what a
resume applies or refuses, and plain names for disk errors. Which checkpoint is read and the
universal conversion are in tests/integration/training/test_checkpoint_format.py; the CLI cases are in the fault suite and
the bad-input catalogue."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from megatron_loop.checkpoint.manifest import verify_checkpoint
from megatron_loop.checkpoint.publish import prune
from megatron_loop.checkpoint.selection import select_automatic, select_checkpoint
from megatron_loop.config import load_config
from megatron_loop.errors import LoopConfigError, write_failure
from megatron_loop.training.checkpoint import set_aside_newer
from megatron_loop.training.lock import RunLock
from megatron_loop.training.resume import decide_resume
from train_fixtures import REPO, copy_run, reference_run

pytestmark = pytest.mark.slow


def _ckpt(tmp_path):
    return copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"


# ----------------------------------------------------------------------------- the lock


def test_lock_names_the_holder_and_a_second_run_is_refused(tmp_path):
    (tmp_path / "out").mkdir()  # an existing run folder (a new one this run created is removed at release)
    first = RunLock(tmp_path / "out").acquire()
    holder = json.loads((tmp_path / "out" / "run.lock").read_text())
    assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
    with pytest.raises(LoopConfigError, match=rf"run\.lock: train\.output_dir is in use by another run "
                                              rf"\(host {holder['host']}, pid {os.getpid()}, started "
                                              rf"{holder['started']}\): wait for it to end"):
        RunLock(tmp_path / "out").acquire()  # flock is per open file: a second open conflicts
    first.release()
    assert (tmp_path / "out" / "run.lock").read_text() == ""  # released cleanly: no holder line
    second = RunLock(tmp_path / "out").acquire()
    assert second.taken_over is None
    second.release()


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "out"
    code = ("import sys, time; from pathlib import Path; from megatron_loop.training.lock import RunLock; "
            f"RunLock(Path({str(out)!r})).acquire(); print('locked', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert child.stdout.readline().strip() == "locked"
    with pytest.raises(LoopConfigError, match=rf"in use by another run \(host .*, pid {child.pid},"):
        RunLock(out).acquire()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    lock = RunLock(out).acquire()  # the kernel released the flock; the holder line stayed
    assert lock.taken_over["pid"] == child.pid
    lock.release()


def test_failed_start_leaves_no_folder_and_a_vanished_folder_is_noticed(tmp_path):
    lock = RunLock(tmp_path / "new").acquire()
    assert lock.still_ours()
    lock.release()
    assert not (tmp_path / "new").exists()  # created by this run, nothing else written: removed
    lock = RunLock(tmp_path / "kept").acquire()
    shutil.rmtree(tmp_path / "kept")
    assert not lock.still_ours()
    lock.release()


# ----------------------------------------------------------------------------- branches and retention


def test_branch_sets_newer_checkpoints_and_metrics_aside_and_retention_keeps_the_branch(tmp_path):
    ckpt = _ckpt(tmp_path)
    metrics = ckpt.parent / "metrics.jsonl"
    before = metrics.read_text().splitlines()
    chosen = select_checkpoint(ckpt / "global_step9")
    dest = set_aside_newer(ckpt, chosen, metrics)
    assert sorted(p.name for p in dest.iterdir()) == ["global_step10", "metrics.jsonl"]
    verify_checkpoint(dest / "global_step10")  # moved whole, nothing deleted
    aside = [json.loads(line) for line in (dest / "metrics.jsonl").read_text().splitlines()]
    assert aside and {r["step"] for r in aside} == {10}
    assert len(aside) == sum(json.loads(line).get("step", 0) > 9 for line in before)
    assert (ckpt / "latest").read_text() == "global_step9"
    assert select_automatic(ckpt).tag == "global_step9" and select_automatic(ckpt).newer == ()
    # a new save on the branch, then retention: never the abandoned (or a corrupt) newer one
    shutil.copytree(ckpt / "global_step9", ckpt / "global_step11")
    assert prune(ckpt, keep_last=1) == ["global_step9"]
    assert (dest / "global_step10").is_dir()


# ----------------------------------------------------------------------------- what a resume applies


def _plan(**changes):
    ref = reference_run()
    point = select_checkpoint(ref.run_dir / "checkpoints")
    overrides = [f"{k}={v}" for k, v in changes.items() if "." in k]
    cfg = load_config(str(ref.config), [f"train.output_dir={ref.run_dir}", *overrides])
    stage = 1 if "zero" not in changes else changes["zero"]
    return decide_resume(point, cfg, world_size=changes.get("world", 1), zero_stage=stage)


def test_resume_applies_schedule_and_optimizer_changes_and_refuses_the_rest():
    assert not _plan().schedule and not _plan().optimizer and not _plan().universal
    plan = _plan(**{"train.lr": 1e-3, "train.max_steps": 20, "train.weight_decay": 0.05,
                    "train.log_interval": 2, "data.num_workers": 2})
    assert plan.schedule == ["train.lr 0.003 -> 0.001", "train.max_steps 10 -> 20"]
    assert plan.optimizer == ["train.weight_decay 0.1 -> 0.05"]
    assert plan.other == ["data.num_workers 0 -> 2", "train.log_interval 1 -> 2"]
    for key, value, why in [("train.seq_length", 16, "data position counts sequences"),
                            ("train.global_batch_size", 16, "counted in global batches"),
                            ("train.seed", 1, "document order"),
                            ("model.core_layers", 3, "different architecture")]:
        with pytest.raises(LoopConfigError, match=rf"manifest\.json: .*({re.escape(key)}.*{why}|{why}.*{re.escape(key)})"):
            _plan(**{key: value})


def test_resume_on_another_data_parallel_size_or_zero_stage():
    assert _plan(world=2).universal  # ZeRO 1: through the universal checkpoint
    with pytest.raises(LoopConfigError, match=r"written with ZeRO stage 1, resumed with stage 3 .* resume "
                                              r"with a stage-1 DeepSpeed config"):
        _plan(zero=3)
    point = select_checkpoint(reference_run().run_dir / "checkpoints")
    zero3 = dataclasses.replace(point, manifest={**point.manifest, "zero_stage": 3, "world_size": 2})
    cfg = load_config(str(reference_run().config))
    with pytest.raises(LoopConfigError, match=r"written by 2 data-parallel ranks, resumed with 1; a ZeRO 3 "
                                              r"checkpoint resumes only on 2 ranks"):
        decide_resume(zero3, cfg, world_size=1, zero_stage=3)


# ----------------------------------------------------------------------------- disk errors


def test_torch_write_failure_is_named_not_an_enforce_fail(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(RuntimeError, match="enforce fail|file write failed") as raised:
            torch.save(torch.zeros(100_000), tmp_path / "big.pt")  # the kernel refuses the write
        text = write_failure(raised.value, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert text.startswith("file too large (the process file-size limit, ulimit -f) (EFBIG) (a file reached the limit "
                           "of 100000 bytes; torch: ")
    assert write_failure(OSError(28, "No space left on device", "x.pt"), tmp_path) == \
        "no space left on device (ENOSPC): x.pt"


def test_slurm_example_sets_what_the_reliability_doc_says():
    doc = (REPO / "docs" / "RELIABILITY.md").read_text()
    block = doc[doc.index("```bash\n#SBATCH --signal"):]
    block = block[len("```bash\n"):block.index("```", 8)]
    sbatch = (REPO / "examples" / "slurm_pretrain.sbatch").read_text()
    missing = [line for line in block.splitlines() if line.strip() and line not in sbatch.splitlines()]
    assert not missing, f"examples/slurm_pretrain.sbatch lacks: {missing}"


@pytest.mark.timeout(300)
def test_resume_from_another_runs_checkpoint_adopts_it_as_the_branch_point(tmp_path):
    """``--resume A/checkpoints/global_step9`` into folder B that has its own global_step9 (and 10):
    B's own 9 and 10 move aside (another lineage), A's step 9 is published in B (hard links) and
    ``latest`` names it, so an automatic restart after a crash resumes A's lineage."""
    other = copy_run(reference_run().run_dir, tmp_path / "other") / "checkpoints"
    ckpt = _ckpt(tmp_path)
    own9 = {p.name: p.read_bytes() for p in (ckpt / "global_step9").iterdir()}
    point = select_checkpoint(other / "global_step9")
    dest = set_aside_newer(ckpt, point, ckpt.parent / "metrics.jsonl")
    assert sorted(p.name for p in dest.iterdir()) == ["global_step10", "global_step9", "metrics.jsonl"]
    assert {p.name: p.read_bytes() for p in (dest / "global_step9").iterdir()} == own9  # kept, not deleted
    shard = "mp_rank_00_model_states.pt"
    assert os.path.samefile(ckpt / "global_step9" / shard, other / "global_step9" / shard)  # A's, not B's
    assert (ckpt / "latest").read_text() == "global_step9"
    restart = select_automatic(ckpt)
    assert restart.tag == "global_step9" and restart.root == ckpt and restart.notes == ()


@pytest.mark.timeout(60)
def test_file_size_limit_above_the_probe_size_is_named_as_efbig(tmp_path):
    """``ulimit -f`` of 2 MiB: the 1 MiB probe write passes, so only the limit explains torch's failure."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, hard))
    try:
        with pytest.raises(RuntimeError) as raised:
            torch.save(torch.zeros(1 << 20), tmp_path / "big.pt")  # 4 MiB
        text = write_failure(raised.value, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert text.startswith("file too large (the process file-size limit, ulimit -f) (EFBIG) (a file reached the "
                           f"limit of {2 << 20} bytes; torch: "), text


@pytest.mark.timeout(60)
def test_lock_file_naming_a_live_process_says_so_when_taken_over(tmp_path):
    """A run folder copied from a running run: its run.lock names a live pid on this host but no
    process holds the flock. The takeover says what was seen, not that the holder ended."""
    out = tmp_path / "copied"
    out.mkdir()
    (out / "run.lock").write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid(),
                                              "started": "2026-01-01T00:00:00Z", "started_epoch": time.time()}))
    lock = RunLock(out).acquire()
    try:
        note = lock.takeover_note()
    finally:
        lock.release()
    assert note == (f"{out / 'run.lock'}: taking over train.output_dir: the lock file names host "
                    f"{os.uname().nodename}, pid {os.getpid()}, started 2026-01-01T00:00:00Z (alive) but no process "
                    "holds its lock: the folder was copied from another run, or that run holds a copy elsewhere")


def test_connection_refused_is_not_reported_as_a_start_up_timeout():
    """torch's TCPStore client after a torchrun restart (the old address); its text also names
    the timeout it would have waited, which read as "did not all start within 60 s" 0.4 s in."""
    from megatron_loop.training.distributed import collective_failure

    seen = ("The client socket has failed to connect to [localhost]:29500 (errno: 111 - Connection refused). "
            "The server socket has timed out (timeout 60000 ms)")
    why = collective_failure(RuntimeError(seen), 60, started=False)
    assert why == ("a rank could not connect to another rank (connection refused: no process listening there, "
                   f"e.g. a rank that exited, or an old address after a torchrun restart; seen: {seen})")


def test_gloo_timeouts_are_reported_as_the_collective_timeout():
    """gloo's own words for a peer that stopped: the rank that waited on it in DeepSpeed's save
    barrier (a data-parallel rank stopped at its shard open mid-save: "Application timeout caused
    pair closure", before printed raw) and a connection that never came up ("Connect timeout")."""
    from megatron_loop.training.distributed import collective_failure

    seen = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41289: Application "
            "timeout caused pair closure")
    assert collective_failure(RuntimeError(seen), 600) == (
        "a collective operation did not complete within train.collective_timeout_s=600 s: another rank stopped, "
        "hung or died")
    seen = "Gloo connectFullMesh failed with [../gloo/transport/tcp/pair.h:311] Connect timeout [none]"
    assert collective_failure(RuntimeError(seen), 60, started=False) == (
        "the ranks did not all start within train.collective_timeout_s=60 s (a rank failed, or started much later "
        f"than the others; seen: {seen})")
