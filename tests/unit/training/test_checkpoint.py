"""``training/checkpoint.py``'s resume orchestration, in one process (a world of one, rank 0 deciding):
which checkpoint a start resumes (``choose_resume_point``), the branch it starts (``start_branch``),
the universal copy for another number of data-parallel ranks (``universal_copy``; the conversion
itself is stood in for, it is tests/integration/training/test_checkpoint_format.py's) and what the
log says (``resume_messages``). Checkpoints are folders with a manifest, published as a save
publishes them; saving and loading through DeepSpeed are the integration suites'."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from megatron_loop.checkpoint.folders import LATEST, SET_ASIDE, read_latest
from megatron_loop.checkpoint.manifest import write_manifest
from megatron_loop.checkpoint.publish import publish
from megatron_loop.checkpoint.selection import SelectedCheckpoint
from megatron_loop.checkpoint.state import TrainState
from megatron_loop.errors import LoopDataError
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.training import checkpoint
from megatron_loop.training.checkpoint import choose_resume_point, resume_messages, start_branch, universal_copy
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.resume import ResumeDecision

RANK0 = DistInfo(0, 1, 0)


@pytest.fixture(autouse=True)
def world_of_one():
    ensure_groups()  # rank 0's decision is broadcast to every rank: here, itself


def _save(root: Path, step: int, world_size: int = 1) -> Path:
    """A published checkpoint of ``step`` (one shard file, its manifest, ``latest`` naming it)."""
    tag = f"global_step{step}"
    partial = root / f"{tag}.partial"
    partial.mkdir(parents=True)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"weights of step %d" % step)
    write_manifest(partial, {"tag": tag, "step": step, "consumed_samples": 8 * step, "world_size": world_size})
    publish(root, partial, tag)
    return root / tag


def test_no_checkpoint_and_no_resume_starts_fresh(tmp_path):
    root = tmp_path / "checkpoints"
    assert choose_resume_point(root, None, True, RANK0) is None
    (root / "global_step3.partial").mkdir(parents=True)  # a save that crashed before publishing
    assert choose_resume_point(root, None, True, RANK0) is None
    assert not (root / "global_step3.partial").exists()  # removed by the start


def test_automatic_resume_follows_latest_and_skips_a_corrupt_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        _save(root, step)
    assert choose_resume_point(root, None, True, RANK0).tag == "global_step4"
    assert choose_resume_point(root, None, False, RANK0) is None  # train.resume: false, no --resume
    (root / "global_step4" / "mp_rank_00_model_states.pt").write_bytes(b"weights of step 9")  # same size
    point = choose_resume_point(root, None, True, RANK0)
    assert (point.tag, point.step, point.manifest["consumed_samples"]) == ("global_step2", 2, 16)
    assert len(point.notes) == 1 and point.notes[0].startswith("skipping checkpoint global_step4: ")
    assert "sha256 differs" in point.notes[0]


def test_explicit_resume_is_that_checkpoint_or_an_error_naming_the_bad_file(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        _save(root, step)
    point = choose_resume_point(root, str(root / "global_step2"), True, RANK0)
    assert point.path == root / "global_step2" and point.notes == ()  # latest (4) does not decide
    (root / "global_step2" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(LoopDataError, match=r"global_step2/mp_rank_00_model_states.pt: missing; the manifest "
                                            r"lists it"):
        choose_resume_point(root, str(root / "global_step2"), True, RANK0)
    with pytest.raises(LoopDataError, match=r"--resume .*nowhere: not found"):
        choose_resume_point(root, str(tmp_path / "nowhere"), True, RANK0)


def test_start_branch_sets_newer_checkpoints_and_their_metrics_aside(tmp_path):
    out = tmp_path / "run"
    root = out / "checkpoints"
    for step in (2, 4, 6):
        _save(root, step)
    records = [{"step": s, "loss": 10 - s} for s in range(1, 7)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    point = choose_resume_point(root, str(root / "global_step2"), True, RANK0)
    aside = start_branch(root, point, out, RANK0)
    assert aside.parent == root / SET_ASIDE and aside.name.endswith("-resumed-global_step2")
    assert sorted(p.name for p in aside.iterdir()) == ["global_step4", "global_step6", "metrics.jsonl"]
    moved = [json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines()]
    assert moved == records[2:]  # the records of steps 3-6, logged on the abandoned branch
    assert sorted(p.name for p in root.iterdir()) == ["global_step2", LATEST, SET_ASIDE]
    assert read_latest(root) == "global_step2"
    again = choose_resume_point(root, None, True, RANK0)
    assert start_branch(root, again, out, RANK0) is None  # nothing newer: no branch, nothing moved


def test_a_second_rollback_to_the_same_step_within_one_second_gets_its_own_folder(tmp_path, monkeypatch):
    """A frozen clock (or two rollbacks within a second): the second branch's folder gets a suffix
    instead of failing on the first one's name (ENOTEMPTY) or merging into it."""
    out = tmp_path / "run"
    root = out / "checkpoints"
    monkeypatch.setattr(checkpoint.time, "strftime", lambda fmt, *a: "20261126-090000")
    names = []
    for _ in range(2):
        for step in (2, 4):
            if not (root / f"global_step{step}").exists():
                _save(root, step)
        point = choose_resume_point(root, str(root / "global_step2"), True, RANK0)
        names.append(start_branch(root, point, out, RANK0).name)
    assert names == ["20261126-090000-resumed-global_step2", "20261126-090000-resumed-global_step2-2"]
    assert all((root / SET_ASIDE / n / "global_step4").is_dir() for n in names)


def test_a_damaged_latest_is_skipped_and_replaced_by_the_branch_point(tmp_path):
    """Automatic resume with bytes that are not a tag in ``latest`` (RELIABILITY.md row 41): the
    newest complete checkpoint is chosen with the reason, and starting its branch rewrites
    ``latest`` instead of failing on the damaged pointer a second time."""
    out = tmp_path / "run"
    root = out / "checkpoints"
    for step in (2, 4):
        _save(root, step)
    (root / LATEST).write_bytes(bytes(range(256)))
    point = choose_resume_point(root, None, True, RANK0)
    assert point.tag == "global_step4" and point.notes[0].startswith(f"skipping checkpoint latest: {root / LATEST}")
    assert start_branch(root, point, out, RANK0) is None
    assert read_latest(root) == "global_step4"


def test_universal_copy_writes_a_partial_folder_next_to_the_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 2)
    point = choose_resume_point(root, None, True, RANK0)
    stale = root / "global_step2.universal.partial"
    stale.mkdir()
    (stale / "left_by_a_crash").write_text("x")
    converted = []

    def to_universal(source, dest):
        converted.append((source, dest, dest.exists()))
        dest.mkdir()
        (dest / "zero").mkdir()

    monkeypatch.setattr(checkpoint, "to_universal", to_universal)
    assert universal_copy(root, point, RANK0) == stale
    assert converted == [(root / "global_step2", stale, False)]  # the stale folder removed first
    assert [p.name for p in stale.iterdir()] == ["zero"]

    def disk_full(source, dest):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "to_universal", disk_full)
    with pytest.raises(LoopDataError, match=r"global_step2.universal.partial: writing the universal checkpoint "
                                            r"failed \(no space left on device \(ENOSPC\)\)"):
        universal_copy(root, point, RANK0)


def test_resume_messages_say_what_was_skipped_set_aside_changed_and_where_the_run_starts(tmp_path):
    point = SelectedCheckpoint(tmp_path, "global_step4", {"world_size": 2},
                               skipped=(("global_step6", "corrupt"),))
    plan = ResumeDecision(universal=True, schedule=["train.lr 0.003 -> 0.001"], other=["train.log_interval 1 -> 5"])
    state = TrainState(step=4, consumed_samples=32)
    messages = resume_messages(point, plan, tmp_path / "set_aside" / "x", "schedule: 10 steps left", state,
                               DistInfo(0, 4, 0), None, total_steps=10)
    assert messages == [
        "skipping checkpoint global_step6: corrupt",
        f"starting a new branch at global_step4: newer checkpoints and their metrics moved to {tmp_path}/set_aside/x",
        "resume: 2 -> 4 data-parallel ranks: loading through DeepSpeed's universal checkpoint (weights, Muon "
        "momentum, AdamW moments re-partitioned)",
        "resume: applying changed settings: train.lr 0.003 -> 0.001",
        "resume: changed settings that take effect now: train.log_interval 1 -> 5",
        "schedule: 10 steps left",
        f"resuming from {tmp_path}/global_step4 (step 4, 32 samples consumed; newest complete checkpoint)",
    ]
    done = resume_messages(SelectedCheckpoint(tmp_path, "global_step4", None), ResumeDecision(), None, None, state,
                           RANK0, str(tmp_path), total_steps=4)
    assert done == [f"resuming from {tmp_path}/global_step4 (step 4, 32 samples consumed; --resume)",
                    "nothing left to train: the checkpoint is at step 4 and the config asks for 4 steps"]
