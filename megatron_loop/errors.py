"""Project exceptions. CLIs catch them and print one ``error: ...`` line, exit code 2."""

import errno
import os
import re
import stat
from pathlib import Path


class LoopConfigError(ValueError):
    """A configuration value (YAML key, CLI override, model field) is invalid."""


class LoopDataError(ValueError):
    """Input data (corpus, indexed prefix, tokenizer, checkpoint) is missing or malformed."""


_PLAIN_ERRNO = {
    "ENOSPC": "no space left on device",
    "EDQUOT": "disk quota exceeded",
    "EROFS": "read-only file system",
    "EACCES": "permission denied",
    "EPERM": "operation not permitted",
    "EFBIG": "file too large (the process file-size limit, ulimit -f)",
    "EIO": "input/output error",
    "ENOENT": "no such file or directory",
    "ENOTDIR": "a path component is not a folder",
    "ESTALE": "stale file handle (network file system)",
}


def os_error_text(error: OSError) -> str:
    """An OS error in plain words with its errno name, e.g. ``no space left on device (ENOSPC)``."""
    name = errno.errorcode.get(error.errno or 0)
    words = _PLAIN_ERRNO.get(name or "", error.strerror or str(error))
    return f"{words} ({name})" if name else words

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def path_kind(mode: int) -> str:
    """What an ``os.stat`` mode that is not a regular file is, in words (``a folder``, ``a character device``)."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def file_problem(path: str) -> str | None:
    """None for a regular file (or a link to one); else ``missing PATH`` or ``PATH is a named pipe
    (FIFO), not a regular file`` (a link says where it points). A FIFO or a device such as
    ``/dev/zero`` exists, so calling it "missing" would send the user looking for a file that is there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"missing {path}" + (f" (a link to the missing {os.readlink(path)})" if os.path.islink(path) else "")
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    target = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return f"{path}{target} is {path_kind(mode)}, not a regular file"


SHARED_MEMORY = "/dev/shm"
# Temporary names of the writers (atomic.py's ``.NAME.tmp-PID-RANDOM.SUFFIX`` and ``.NAME.old-...``,
# preprocessing's ``P.tmpPID.bin``): an error names the file the user knows, which the temporary one
# stood for (it is removed on the way out, so naming it would point at nothing).
_TEMPORARY = (re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-\d+-[0-9a-f]+(?P<suffix>\.[^.]*)?$"),
              re.compile(r"^(?P<name>.+)\.tmp\d+(?P<suffix>(?:_valid)?\.(?:bin|idx))$"))


def user_path(path: str | os.PathLike) -> str:
    """The path a message names for ``path``: the target a temporary file stands for, the folder a
    write probe tested (:func:`write_failure`, ``training/preflight.py``), else itself."""
    path = Path(path)
    if re.fullmatch(r"\.write_probe\.\d+", path.name):
        return str(path.parent)
    m = _TEMPORARY[0].match(path.name)
    if m:
        return str(path.with_name(m.group("name")))
    m = _TEMPORARY[1].match(path.name)
    return str(path.with_name(m.group("name") + m.group("suffix"))) if m else str(path)


def os_error_line(error: OSError) -> str:
    """One line for an OS error reaching a command line (a full disk, a read-only or immutable
    folder, shared memory): the file the user knows (a rename's target, not the temporary file
    that is gone: ``latest`` turned into a folder names ``latest``), the condition, and shared
    memory named as such (DataLoader workers and multiprocessing put their queues and batches in
    /dev/shm: a full /dev/shm is not the output folder's disk)."""
    target = error.filename2 if getattr(error, "filename2", None) else error.filename
    where = user_path(os.fsdecode(target)) if target not in (None, "") and not isinstance(target, int) else None
    what = os_error_text(error)
    if where is not None and (where == SHARED_MEMORY or where.startswith(SHARED_MEMORY + "/")):
        return f"{where}: {what} in shared memory ({SHARED_MEMORY}); give the job more shared memory"
    return what if where is None else f"{where}: {what}"


def first_line(error: BaseException) -> str:
    """Errors are reported on one line (the CLI prints exactly one ``error:`` line)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def write_failure(error: BaseException, folder: Path) -> str:
    """Why writing under ``folder`` failed, in plain words. torch's zip writer reports a full disk
    as ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``; a 1 MiB probe write
    then names the condition (ENOSPC, EDQUOT, EFBIG, EROFS, ...)."""
    if isinstance(error, OSError):
        target = getattr(error, "filename2", None) or error.filename
        return os_error_text(error) + (f": {user_path(os.fsdecode(target))}" if target else "")
    import resource
    import shutil

    if m := re.search(r"os error (\d+)", str(error)):  # safetensors (Rust) reports errno as "os error N"
        return os_error_text(OSError(int(m.group(1)), "")) + f" ({first_line(error)})"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:  # a file-size limit fails only the big file; a small probe passes
        big = max((p.stat().st_size for p in folder.rglob("*") if p.is_file()), default=0) if folder.is_dir() else 0
        if big >= limit:
            return (f"{os_error_text(OSError(errno.EFBIG, ''))} (a file reached the limit of {limit} bytes; "
                    f"torch: {first_line(error)})")
    probe = folder / f".write_probe.{os.getpid()}"
    try:
        with probe.open("wb") as f:
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return f"{os_error_text(e)}: {folder} (torch: {first_line(error)})"
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:  # a folder that refuses the probe refuses its removal too
            pass
    try:
        free = shutil.disk_usage(folder).free
        return f"{first_line(error)} ({free / 2**20:.0f} MiB free on that file system)"
    except OSError:
        return first_line(error)
