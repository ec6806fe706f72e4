"""What is wrong with the two files of an indexed dataset prefix (``P.bin``, ``P.idx``) before they
are opened, in words: missing, or there but not a regular file. A named pipe (FIFO) or a device
such as ``/dev/zero`` in their place exists, so calling it "missing" would send the user looking
for a file that is there; it cannot be memory-mapped or sized, so it is refused as what it is.
Standard library only: ``--dry-run`` and the checks before training use it without torch."""

from __future__ import annotations

from megatron_loop.errors import file_problem


def prefix_file_problem(prefix: str, extensions: tuple[str, ...] = (".bin", ".idx")) -> str | None:
    """What is wrong with ``P.bin`` and ``P.idx`` (in the order of ``extensions``), as one phrase:
    ``missing P.bin and P.idx`` when both are simply missing, else each :func:`file_problem`
    joined by "and"; None when both are regular files."""
    problems = [p for p in (file_problem(f"{prefix}{ext}") for ext in extensions) if p]
    if len(problems) == 2 and all(p.startswith("missing ") and " (" not in p for p in problems):
        return f"{problems[0]} and {problems[1][len('missing '):]}"
    return " and ".join(problems) or None
