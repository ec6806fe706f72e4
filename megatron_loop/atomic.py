"""Publishing a file or a folder whole: every output a tool writes goes to a temporary name in the
same folder and is renamed over the target when complete (``os.replace`` is atomic within one
file system). A kill at any moment leaves the previous version or the new one, never a truncated
file or a half-written folder.

    write_atomic(path, text_or_bytes)          # a plain file (JSON, a report, a pointer)
    with atomic_path(path) as tmp:             # a library writes the file (savefig, torch.save)
        fig.savefig(tmp)
    tmp = staging_folder(out)                  # a folder (an HF export): write into tmp, then
    publish_folder(tmp, out)                   #   swap it in; clean_leftovers(out) after a kill

The temporary file is hidden (``.NAME.tmp-PID-RANDOM.SUFFIX``: the suffix kept, so writers that
pick a format from it still do) and created with the user's umask. ``durable=True`` also
fsyncs the file and the folder, for files whose loss after a power cut matters (checkpoint
pointers, manifests).
"""

from __future__ import annotations

import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_STAGING, _RETIRED = ".tmp-", ".old-"


def _hidden_sibling(target: Path, kind: str, suffix: str = "") -> Path:
    """``.NAME{kind}PID-RANDOM{suffix}`` next to ``target``: hidden, on the same file system (so
    the final rename is atomic), and naming the writer's pid for :func:`clean_leftovers`."""
    return target.with_name(f".{target.name}{kind}{os.getpid()}-{secrets.token_hex(3)}{suffix}")


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's or a folder's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = False) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed to ``path`` when the block ends without an
    error, removed otherwise. The folder is created if needed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _hidden_sibling(target, _STAGING, target.suffix)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, target)
        if durable:
            fsync_path(target.parent)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike, data: str | bytes, durable: bool = False,
                 encoding: str = "utf-8") -> Path:
    """Write ``data`` (text or bytes) to ``path`` whole; returns the path."""
    with atomic_path(path, durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode(encoding) if isinstance(data, str) else data)
    return Path(path)


# ----------------------------------------------------------------------------- folders


def process_alive(pid: int, started_epoch: float | None = None) -> bool:
    """The process ``pid`` exists (and, given when the process we mean started, is not a newer one
    that reused the number): the owner of a lock or of a temporary folder is still running."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return started_epoch is None or proc.create_time() <= started_epoch + 1
    except psutil.NoSuchProcess:
        return False


def _leftovers(output: Path, kind: str) -> list[Path]:
    return sorted(output.parent.glob(f".{output.name}{kind}*")) if output.parent.is_dir() else []


def _pid_of(leftover: Path) -> int | None:
    try:
        return int(leftover.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return None


def _writer_running(leftover: Path) -> bool:
    pid = _pid_of(leftover)
    return pid is not None and pid != os.getpid() and process_alive(pid)


def staging_folder(output: Path) -> Path:
    """A new hidden folder next to ``output`` to write a folder into, created with the user's umask
    (``tempfile.mkdtemp`` would make it 0700); :func:`publish_folder` puts it in place."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = _hidden_sibling(output, _STAGING)
    tmp.mkdir()
    return tmp


def swap_folder(new: Path, target: Path, retired: Path) -> Path:
    """Rename the folder ``new`` to ``target``. An existing ``target`` is renamed to ``retired``
    first and removed only once ``new`` is in place, so a kill at any moment leaves the old folder
    or the new one (the old one under ``retired`` when killed between the two renames)."""
    if target.exists():
        os.replace(target, retired)
        os.replace(new, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(new, target)
    return target


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_folder(tmp: Path, output: Path) -> Path:
    """Give ``tmp`` (from :func:`staging_folder`) the modes the user's umask asks for (libraries
    write some files 0600), then swap it in at ``output`` (:func:`swap_folder`; an old folder
    left aside by a kill is restored by :func:`clean_leftovers`)."""
    mask = _umask()
    for path in [tmp, *tmp.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
    return swap_folder(tmp, output, _hidden_sibling(output, _RETIRED))


def clean_leftovers(output: Path) -> list[str]:
    """After a folder publish killed half-way: an old ``output`` swapped out but not yet replaced
    is put back, staging folders of writers that are gone are removed (those of a running writer
    are left alone). Returns what was done (for the log)."""
    done = []
    for retired in _leftovers(output, _RETIRED):
        if _writer_running(retired):
            continue
        if not output.exists():
            os.replace(retired, output)
            done.append(f"restored the previous {output} from {retired.name}")  # an export or a sweep's outputs
        else:
            shutil.rmtree(retired, ignore_errors=True)
            done.append(f"removed {retired}")
    for staging in _leftovers(output, _STAGING):
        if not _writer_running(staging):
            shutil.rmtree(staging, ignore_errors=True)
            done.append(f"removed the unfinished export {staging}")
    return done
