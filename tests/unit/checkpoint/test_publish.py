"""``checkpoint/publish.py``: a save published by a rename, ``latest`` written last, retention and adoption
(the crashes between those writes: tests/integration/reliability/test_checkpoints.py)."""

from __future__ import annotations

import os

from megatron_loop.checkpoint.folders import LATEST, PARTIAL, complete_tags, read_latest
from megatron_loop.checkpoint.publish import adopt_checkpoint, prune, publish, publish_tag, remove_partials


def _save(root, tag, content="w"):
    partial = root / (tag + PARTIAL)
    partial.mkdir(parents=True)
    (partial / "model.pt").write_text(content)
    return partial


def test_publish_renames_the_partial_and_points_latest_at_it(tmp_path):
    publish(tmp_path, _save(tmp_path, "global_step10"), "global_step10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step10", LATEST]
    assert (tmp_path / "global_step10" / "model.pt").read_text() == "w"
    assert read_latest(tmp_path) == "global_step10"


def test_publish_tag_replaces_a_published_folder_and_leaves_latest_alone(tmp_path):
    publish(tmp_path, _save(tmp_path, "global_step10", "old"), "global_step10")
    publish(tmp_path, _save(tmp_path, "global_step20"), "global_step20")
    publish_tag(tmp_path, _save(tmp_path, "global_step10", "new"), "global_step10")  # saved again after a resume
    assert (tmp_path / "global_step10" / "model.pt").read_text() == "new"
    assert read_latest(tmp_path) == "global_step20"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(PARTIAL)]  # the replaced one is gone


def test_remove_partials_removes_only_partial_folders(tmp_path):
    _save(tmp_path, "global_step5")
    (tmp_path / "global_step5.replaced.partial").mkdir()
    (tmp_path / "notes.partial").write_text("a file, not a save")
    (tmp_path / "global_step4").mkdir()
    remove_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step4", "notes.partial"]
    remove_partials(tmp_path / "absent")  # no folder: nothing to do


def test_prune_keeps_the_newest_by_step_not_by_name(tmp_path):
    for step in (2, 10, 9, 100):
        (tmp_path / f"global_step{step}").mkdir()
    (tmp_path / "global_stepX").mkdir()  # not a tag: never pruned
    assert prune(tmp_path, 2) == ["global_step9", "global_step2"]
    assert complete_tags(tmp_path) == [(100, "global_step100"), (10, "global_step10")]
    assert (tmp_path / "global_stepX").is_dir()
    assert prune(tmp_path, 5) == []


def test_adopt_checkpoint_publishes_a_linked_copy_under_its_tag(tmp_path):
    source = tmp_path / "other" / "global_step7"
    source.mkdir(parents=True)
    (source / "model.pt").write_text("weights")
    (source / "sub").mkdir()
    (source / "sub" / "opt.pt").write_text("state")
    root = tmp_path / "mine"
    (root / ("global_step7" + PARTIAL)).mkdir(parents=True)  # a crashed adoption's leftover
    adopt_checkpoint(source, root)
    adopted = root / "global_step7"
    assert (adopted / "model.pt").read_text() == "weights" and (adopted / "sub" / "opt.pt").read_text() == "state"
    assert os.stat(adopted / "model.pt").st_ino == os.stat(source / "model.pt").st_ino  # hard link, same fs
    assert sorted(p.name for p in root.iterdir()) == ["global_step7"]  # latest is the caller's
    assert (source / "model.pt").exists()
