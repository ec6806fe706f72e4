"""checkpoint/selection.py: a tag is a folder name in the run's checkpoint folder. A ``latest`` or a
``--tag`` that holds a path (``../../other/checkpoints/global_step2``) would read another run's
weights: automatic selection skips such a ``latest`` with the documented ``skipping checkpoint
latest: ...`` line and reads this folder's newest checkpoint; a named root or a ``--tag`` is refused.
(Before: the other run's checkpoint was exported, or ``latest`` ignored without a word.)"""

from __future__ import annotations

import pytest

from megatron_loop.checkpoint.manifest import write_manifest
from megatron_loop.checkpoint.selection import report_selection, select_automatic, select_checkpoint, select_explicit
from megatron_loop.errors import LoopDataError


def _checkpoint(root, step: int):
    tag = root / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "weights.pt").write_bytes(bytes([step]) * 16)
    write_manifest(tag, {"step": step})
    return tag


def test_a_tag_that_leaves_the_checkpoint_folder_is_never_read(tmp_path, capsys):
    ours, other = tmp_path / "run" / "checkpoints", tmp_path / "other" / "checkpoints"
    _checkpoint(ours, 5)
    _checkpoint(other, 31)
    away = "../../other/checkpoints/global_step31"
    assert (ours / away).is_dir()  # the path does reach the other run
    (ours / "latest").write_text(away)
    why = (f"{ours / 'latest'} names '{away}', a path, not a checkpoint of {ours}; expected the name of a "
           "checkpoint folder in it such as global_step30")
    chosen = select_automatic(ours)
    assert (chosen.root, chosen.tag, chosen.notes) == (ours, "global_step5", (f"skipping checkpoint latest: {why}",))
    assert select_checkpoint(ours).tag == "global_step5"  # an export: the same fallback
    report_selection(chosen)
    assert capsys.readouterr().err.splitlines() == [f"warning: skipping checkpoint latest: {why}",
                                                    f"reading {ours / 'global_step5'} (the newest complete checkpoint)"]
    with pytest.raises(LoopDataError) as e:
        select_explicit(ours)  # --resume of the folder: refused
    assert str(e.value) == why
    with pytest.raises(LoopDataError) as e:
        select_checkpoint(ours, tag=away)  # convert_to_hf.py --tag
    assert str(e.value) == (f"--tag names '{away}', a path, not a checkpoint of {ours}; expected the name of a "
                            "checkpoint folder in it such as global_step30")
    (ours / "latest").write_text("global_step5")
    assert select_explicit(ours).tag == select_checkpoint(ours, tag="global_step5").tag == "global_step5"
