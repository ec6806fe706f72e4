"""Project exceptions. CLIs catch them and print one ``error: ...`` line, exit code 2."""


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
    import errno

    name = errno.errorcode.get(error.errno or 0)
    words = _PLAIN_ERRNO.get(name or "", error.strerror or str(error))
    return f"{words} ({name})" if name else words
