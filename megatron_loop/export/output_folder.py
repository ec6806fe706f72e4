"""Where an export may be written, by whom, and what ``--overwrite`` may replace (docs/RELIABILITY.md).

One export at a time per output folder (:class:`ExportLock`, held from the first check to the publish).

An export is published whole (:func:`megatron_loop.atomic.publish_folder`: the old folder swapped
out, then removed), so replacing the wrong folder loses it: ``--overwrite`` therefore replaces
only a folder that this tool exported and nobody changed since (the export's
:data:`EXPORT_RECORD` lists every file it wrote), never a run folder (its checkpoints, metrics and
``run.lock``, whether or not a live run holds it), a checkpoint, or a folder with files of others.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from megatron_loop.checkpoint.folders import CONFIG_NAME, MANIFEST, step_of
from megatron_loop.errors import LoopConfigError, LoopDataError, os_error_text
from megatron_loop.training.lock import holder_text, read_holder, run_lock_holder, write_holder


# The list of files an export wrote, inside it: what --overwrite may replace (nothing else).
EXPORT_RECORD = ".megatron_loop_export.json"
# What a run folder or a checkpoint folder holds (training/lock.py, training/metrics.py, checkpoint/folders.py).
_RUN_MARKERS = ("run.lock", "metrics.jsonl", "checkpoints", "latest", MANIFEST, CONFIG_NAME)


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def _checkpoint_root(folder: Path) -> bool:
    """A run's ``checkpoints/`` folder, which resume, retention and the saves manage: it holds the
    ``latest`` pointer, the run config written next to the checkpoints, or a ``global_step*`` folder
    that is a checkpoint (a manifest or DeepSpeed's files; exports named after steps are not)."""
    if not folder.is_dir():
        return False
    if (folder / "latest").is_file() or (folder / CONFIG_NAME).is_file():
        return True
    return any(step_of(p.name) is not None and ((p / MANIFEST).is_file() or any(p.glob("mp_rank_*")))
               for p in folder.iterdir() if p.is_dir())


def check_not_in_a_checkpoint(output: Path) -> None:
    """An export written into a checkpoint folder would change what its manifest describes; one
    written into a run's ``checkpoints/`` folder (a ``global_step*`` name the run has not reached,
    ``set_aside/``, any other name, or the folder itself) is the run's to manage: its save of that
    step replaces it, retention removes it, a resume sets it aside."""
    for parent in output.absolute().parents:
        if (parent / MANIFEST).is_file() or step_of(parent.name) is not None:
            raise LoopDataError(f"--output {output}: inside the checkpoint folder {parent}; expected a folder "
                                "outside any checkpoint (e.g. RUN/hf)")
    for folder in (output.absolute(), *output.absolute().parents):
        if _checkpoint_root(folder):
            what = "is" if folder == output.absolute() else "is inside"
            raise LoopDataError(f"--output {output}: {what} the checkpoint folder {folder} of a run, whose saves "
                                "replace a global_step* folder of the same name, whose retention removes old "
                                "ones and whose resume sets folders aside; expected a folder outside it "
                                "(e.g. RUN/hf)")


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
    """List every file of the finished export ``folder`` in it (the last file written), with the
    sha256 of each weight shard: what evaluation and probes check before they load it
    (:func:`verify_export_shards`), since a garbled shard of the same size loads without a word."""
    shards = {p.name: file_sha256(p) for p in sorted(folder.glob("*.safetensors"))}
    (folder / EXPORT_RECORD).write_text(json.dumps({"files": _files_under(folder), "sha256": shards}, indent=1))


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_export_shards(folder: Path) -> None:
    """Every weight shard of an export has the sha256 its record lists (exports written before the
    record held hashes, and folders of other tools, have nothing to check against)."""
    try:
        recorded = json.loads((folder / EXPORT_RECORD).read_text()).get("sha256") or {}
    except (OSError, ValueError, AttributeError):
        return
    for name, digest in sorted(recorded.items()):
        shard = folder / name
        if shard.is_file() and file_sha256(shard) != digest:
            raise LoopDataError(f"{shard}: sha256 differs from {folder / EXPORT_RECORD} (a corrupt or replaced "
                                "weight shard); expected the files as tools/convert_to_hf.py wrote them: export "
                                "the checkpoint again")


class ExportLock:
    """One writer per export folder (``tools/convert_to_hf.py --output``): an exclusive ``flock``
    on a hidden ``.NAME.lock`` next to the output, held from the first check to the publish and
    removed after. Creating it is also the early writability check of the output's folder
    (a read-only or full file system fails here, before the slow consolidation)."""

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.path = self.output.parent / f".{self.output.name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "ExportLock":
        while True:  # a holder that removed the file as we opened it: lock the new one
            try:
                self.output.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise LoopDataError(f"{self.output}: cannot write an export there ({os_error_text(e)}: "
                                    f"{e.filename or self.path}); expected a writable folder") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = read_holder(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise LoopConfigError(f"{self.output}: another export to this folder is running "
                                          f"({holder_text(holder)}): wait for it to end, or choose another "
                                          "--output") from None
                raise LoopDataError(f"{self.output}: cannot lock {self.path} ({os_error_text(e)})") from None
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self.fd = fd
        try:
            write_holder(fd)
        except OSError as e:
            self.__exit__()
            raise LoopDataError(f"{self.output}: cannot write an export there ({os_error_text(e)}: {self.path}); "
                                "expected a writable folder") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while locked: a waiting process sees the new file
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
