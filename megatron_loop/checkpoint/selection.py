"""Which checkpoint to read. Everything that reads a checkpoint (resume, ``convert_to_hf.py``,
``probe_geometry.py``) picks it the same way (:func:`select_checkpoint`): the tag ``latest``
names, verified against its manifest, falling back to the newest older one that verifies; a
checkpoint named explicitly is verified and refused with the name of the bad file. A DeepSpeed
folder without any manifest (written by another tool) is read as is, with a note that it could
not be verified.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from megatron_loop.checkpoint.folders import LATEST, MANIFEST, PARTIAL, complete_tags, read_latest, step_of
from megatron_loop.checkpoint.manifest import verify_checkpoint
from megatron_loop.errors import LoopDataError, path_kind


@dataclass(frozen=True)
class SelectedCheckpoint:
    """One checkpoint to read: ``root / tag``, its verified manifest (None for a folder written by
    another tool), the checkpoints skipped on the way (``skipped``: tag -> why) and the published
    checkpoints newer than it that are not on the branch ``latest`` follows (``newer``)."""

    root: Path
    tag: str
    manifest: dict | None
    skipped: tuple[tuple[str, str], ...] = ()
    newer: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return self.root / self.tag

    @property
    def step(self) -> int | None:
        return (self.manifest or {}).get("step", step_of(self.tag))

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(f"skipping checkpoint {tag}: {why}" for tag, why in self.skipped)


def outside_tag(root: Path, tag: str, source: str) -> str | None:
    """Why ``tag`` (named by ``source``: ``latest`` or ``--tag``) is not a checkpoint of ``root``: a
    tag is one folder name in the run's checkpoint folder; a path (``../../other/checkpoints/
    global_step2``) would read another run's weights. None when it is a plain name."""
    if tag in (".", "..") or any(sep in tag for sep in "/\\"):
        return (f"{source} names '{tag}', a path, not a checkpoint of {root}; expected the name of a checkpoint "
                "folder in it such as global_step30")
    return None


def checkpoint_folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a checkpoint folder at all (None: it may be one): missing, a file, or a Hugging Face
    export (config.json and safetensors), which its reader would otherwise report as a missing ``latest``."""
    if not path.exists():
        return f"{path}: checkpoint folder not found"
    if not path.is_dir():
        kind = "a file" if path.is_file() else path_kind(path.stat().st_mode)
        return (f"{path}: {kind}, not a checkpoint folder; expected a run's checkpoints/ folder or one global_step* "
                "folder in it")
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")) and not (path / LATEST).exists():
        return (f"{path}: a Hugging Face export (config.json and safetensors, tools/convert_to_hf.py), not a training "
                "checkpoint; expected a run's checkpoints/ folder or one global_step* folder in it (an export is "
                "read by eval_loops.py --model and probe_geometry.py --model)")
    return None


def split_checkpoint_path(path: Path) -> tuple[Path, str | None]:
    """A checkpoint root (``latest`` decides) or one tag folder in it."""
    if (path / MANIFEST).is_file() or step_of(path.name) is not None or path.name.endswith(PARTIAL):
        return path.parent, path.name
    return path, None


def select_explicit(path: Path) -> SelectedCheckpoint:
    """Exactly the checkpoint at ``path`` (or the one its ``latest`` names), verified; no fallback."""
    if not path.exists():
        raise LoopDataError(f"--resume {path}: not found; expected a checkpoint folder "
                            "(the run's checkpoints/ folder or one global_step* folder in it)")
    problem = checkpoint_folder_problem(path)
    if problem:
        raise LoopDataError(f"--resume {problem}")
    root, tag = split_checkpoint_path(path)
    if tag is not None and tag.endswith(PARTIAL):
        raise LoopDataError(f"{path}: an unpublished save (interrupted before '{LATEST}' was updated); "
                            "expected a published checkpoint folder such as global_step<N>")
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            raise LoopDataError(f"{root / LATEST}: missing; expected the tag of the checkpoint to resume from")
        problem = outside_tag(root, tag, str(root / LATEST))
        if problem:
            raise LoopDataError(problem)
    return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag))


def select_automatic(root: Path) -> SelectedCheckpoint | None:
    """The checkpoint ``latest`` names if its manifest verifies, else the newest older one that does;
    None when ``root`` holds no checkpoint.

    ``latest`` decides, not the highest step number: after a rollback the newer checkpoints of the
    abandoned branch are not resumed (they are reported in ``newer``). A corrupt or missing
    checkpoint is skipped with the reason; when checkpoints exist but none verifies, that is an
    error (starting over would silently discard a run).
    """
    tags = complete_tags(root)
    skipped: list[tuple[str, str]] = []
    try:
        latest = read_latest(root)
    except LoopDataError as e:  # a damaged pointer: fall back to the newest complete checkpoint
        latest = None
        skipped.append((LATEST, str(e)))
    problem = outside_tag(root, latest, str(root / LATEST)) if latest else None
    if problem:  # never read outside the run's checkpoint folder: fall back, saying why
        latest = None
        skipped.append((LATEST, problem))
    latest_step = step_of(latest) if latest else None
    newer: list[str] = []
    if latest_step is not None and not (root / latest).is_dir():
        skipped.append((latest, f"{root / latest}: named by '{LATEST}' but missing"))
    for step, tag in tags:
        if latest_step is not None and step > latest_step:
            newer.append(tag)  # not on the branch 'latest' follows
            continue
        try:
            return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag), tuple(skipped), tuple(newer))
        except LoopDataError as e:
            skipped.append((tag, str(e)))
    if skipped:
        raise LoopDataError(f"{root}: no loadable checkpoint; "
                            + "; ".join(f"skipping checkpoint {tag}: {why}" for tag, why in skipped))
    return None


def select_checkpoint(path: str | os.PathLike, tag: str | None = None) -> SelectedCheckpoint:
    """What an export or a probe reads from ``path`` (a checkpoint root or one tag folder in it).

    As training resumes: a named tag (``--tag`` or a tag folder) is verified and refused when
    damaged; otherwise ``latest`` with fallback to the newest complete checkpoint. A folder
    without any manifest (a DeepSpeed checkpoint written by another tool) is read unverified.
    """
    path = Path(path)
    problem = checkpoint_folder_problem(path)
    if problem:
        raise LoopDataError(problem)
    root, named = split_checkpoint_path(path)
    problem = outside_tag(root, tag, "--tag") if tag is not None else None
    if problem:  # another run's checkpoint, reached through a path
        raise LoopDataError(problem)
    tag = tag or named
    if tag is not None:
        if tag.endswith(PARTIAL):
            raise LoopDataError(f"{root / tag}: an unpublished save (interrupted); expected a published "
                                "checkpoint folder such as global_step<N>")
        if (root / tag / MANIFEST).is_file() or step_of(tag) is not None:
            return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag))
        if not (root / tag).is_dir():
            raise LoopDataError(f"{root / tag}: checkpoint tag folder not found")
        return SelectedCheckpoint(root, tag, None)
    chosen = select_automatic(root)
    if chosen is not None:
        return chosen
    latest = read_latest(root)  # no global_step* folder: a DeepSpeed folder of another tool
    if latest is None:
        raise LoopDataError(f"{root / LATEST}: missing; expected DeepSpeed's 'latest' tag file (or pass a tag)")
    problem = outside_tag(root, latest, str(root / LATEST))
    if problem:
        raise LoopDataError(problem)
    if not (root / latest).is_dir():
        raise LoopDataError(f"{root / latest}: checkpoint tag folder not found")
    return SelectedCheckpoint(root, latest, None)


def report_selection(chosen: SelectedCheckpoint, file=None) -> None:
    """Tell a tool's user which checkpoint is read and which were skipped (stderr)."""
    file = file or sys.stderr
    for note in chosen.notes:
        print(f"warning: {note}", file=file)
    if chosen.skipped or chosen.newer:
        print(f"reading {chosen.path} (the newest complete checkpoint)", file=file)
    if chosen.manifest is None:
        print(f"warning: {chosen.path}: no {MANIFEST} (not written by pretrain_loop.py); read unverified",
              file=file)
