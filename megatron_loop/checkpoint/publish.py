"""Publishing a checkpoint: a save is written under ``<tag>.partial``, verified, renamed to
``<tag>`` and only then named by ``latest`` (the last write), so a crash at any point leaves the
previous checkpoint published. Also what keeps the folder tidy: leftovers of a crashed save,
retention of the newest ``keep_last``, and adopting another folder's checkpoint as this one's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from megatron_loop.atomic import fsync_path, swap_folder, write_atomic
from megatron_loop.checkpoint.folders import LATEST, PARTIAL, complete_tags


def remove_partials(root: Path) -> None:
    """Leftovers of a save (or a universal conversion) that crashed before publishing."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.endswith(PARTIAL) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def publish_tag(root: Path, partial: Path, tag: str) -> None:
    """Rename the complete folder ``partial`` to ``root / tag``; a published folder of the same
    tag (a step saved again after resuming from an earlier checkpoint) is replaced, and while it
    is swapped out it is a ``.partial`` leftover (:func:`remove_partials`)."""
    swap_folder(partial, root / tag, root / (tag + ".replaced" + PARTIAL))
    fsync_path(root)


def publish(root: Path, partial: Path, tag: str) -> None:
    """Rename the verified folder to its tag, then point ``latest`` at it (the last write)."""
    publish_tag(root, partial, tag)
    write_atomic(root / LATEST, tag, durable=True)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete published checkpoints beyond the newest ``keep_last``; returns the removed tags.

    Only the branch being trained is in ``root``: newer checkpoints of an abandoned branch and
    corrupt ones skipped at resume were set aside
    (:func:`megatron_loop.training.checkpoint.set_aside_newer`), so retention never deletes an
    older good checkpoint to keep a stale or corrupt newer one.
    """
    removed = []
    for _, tag in complete_tags(root)[keep_last:]:
        shutil.rmtree(root / tag, ignore_errors=True)
        removed.append(tag)
    return removed


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link (free on the same file system; published checkpoints are never modified in place,
    only renamed or removed), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def adopt_checkpoint(source: Path, root: Path) -> None:
    """Publish the checkpoint folder ``source`` of another run in ``root`` under its tag (through
    a ``.partial`` folder and a rename, as a save); ``latest`` is left to the caller."""
    partial = root / (source.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, partial, copy_function=_link_or_copy)
    publish_tag(root, partial, source.name)
