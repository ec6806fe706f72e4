"""Where an export may be written, and what ``--overwrite`` may replace (docs/RELIABILITY.md).

An export is published whole (:func:`megatron_loop.atomic.publish_folder`: the old folder swapped
out, then removed), so replacing the wrong folder loses it: ``--overwrite`` therefore replaces
only a folder that this tool exported and nobody changed since (the export's
:data:`EXPORT_RECORD` lists every file it wrote), never a run folder (its checkpoints, metrics and
``run.lock``, whether or not a live run holds it), a checkpoint, or a folder with files of others.
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_loop.checkpoint.folders import CONFIG_NAME, MANIFEST, step_of
from megatron_loop.errors import LoopDataError
from megatron_loop.training.lock import run_lock_holder


# The list of files an export wrote, inside it: what --overwrite may replace (nothing else).
EXPORT_RECORD = ".megatron_loop_export.json"
# What a run folder or a checkpoint folder holds (training/lock.py, training/metrics.py, checkpoint/folders.py).
_RUN_MARKERS = ("run.lock", "metrics.jsonl", "checkpoints", "latest", MANIFEST, CONFIG_NAME)


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def check_not_in_a_checkpoint(output: Path) -> None:
    """An export written into a checkpoint folder would change what its manifest describes."""
    for parent in output.absolute().parents:
        if (parent / MANIFEST).is_file() or step_of(parent.name) is not None:
            raise LoopDataError(f"--output {output}: inside the checkpoint folder {parent}; expected a folder "
                                "outside any checkpoint (e.g. RUN/hf)")


def check_not_a_run(output: Path) -> None:
    """A run folder (its checkpoints, metrics and ``run.lock``, held by a live run or not) or a checkpoint is never
    an export's output, with or without ``--overwrite`` (said first: "pass --overwrite" would point at a flag
    that is then refused)."""
    holds = [name for name in _RUN_MARKERS if (output / name).exists()]
    holds += sorted(p.name for p in output.iterdir() if step_of(p.name) is not None)[:1]
    if holds:
        holder = run_lock_holder(output)
        live = f"; a run is training there ({holder})" if holder else ""
        raise LoopDataError(f"--output {output}: holds a training run or checkpoints ({', '.join(holds)}){live}; "
                            "--overwrite replaces only an export written by convert_to_hf.py: choose another "
                            "--output (e.g. RUN/hf)")


def check_replaceable(output: Path) -> None:
    """``--overwrite`` replaces only an export this tool wrote, unchanged since: never a run folder or a
    checkpoint (:func:`check_not_a_run`), or a folder holding anything the export did not write itself (its
    :data:`EXPORT_RECORD` lists every file). Checked before the slow work and again just before the swap."""
    check_not_a_run(output)
    try:
        recorded = set(json.loads((output / EXPORT_RECORD).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise LoopDataError(f"--output {output}: not an export written by convert_to_hf.py (no readable "
                            f"{EXPORT_RECORD}); --overwrite replaces only such a folder: choose another --output "
                            "or remove the folder yourself") from None
    extra = [name for name in _files_under(output) if name not in recorded and name != EXPORT_RECORD]
    if extra:
        raise LoopDataError(f"--output {output}: holds {output / extra[0]}"
                            + (f" and {len(extra) - 1} more files" if len(extra) > 1 else "")
                            + " that the export did not write; --overwrite would delete them: move them out, "
                            "or choose another --output")


def write_export_record(folder: Path) -> None:
    """List every file of the finished export ``folder`` in it (the last file written)."""
    (folder / EXPORT_RECORD).write_text(json.dumps({"files": _files_under(folder)}, indent=1))
