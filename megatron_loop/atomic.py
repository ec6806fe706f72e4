"""Publishing a file whole: every output a tool writes goes to a temporary name in the same folder
and is renamed over the target when complete (``os.replace`` is atomic within one file system).
A kill at any moment leaves the previous version or the new one, never a truncated file.

    write_atomic(path, text_or_bytes)          # a plain file (JSON, a report, a pointer)
    with atomic_path(path) as tmp:             # a library writes the file (savefig, torch.save)
        fig.savefig(tmp)

The temporary file is hidden (``.NAME.tmp-PID-RANDOM.SUFFIX``: the suffix kept, so writers that
pick a format from it still do) and created with the user's umask. ``durable=True`` also
fsyncs the file and the folder, for files whose loss after a power cut matters (checkpoint
pointers, manifests).
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}{target.suffix}")
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
