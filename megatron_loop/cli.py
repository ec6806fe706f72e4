"""The command-line convention every entry point shares (``pretrain_loop.py`` and ``tools/*.py``): project
errors, and OS errors such as a full disk or a read-only folder, become one ``error: <message>`` line
and exit code 2, Ctrl-C one line and exit code 130; and the argument checks several tools share
(output folders, loop lists, the JSON files the tools write)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from megatron_loop.console import quiet_progress
from megatron_loop.errors import LoopConfigError, LoopDataError, os_error_line

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
INTERRUPTED = ("interrupted (SIGINT): stopped; outputs are published only when complete, so nothing "
               "half-written is left")


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``. A LoopConfigError/LoopDataError prints ``error: ...`` and returns 2; so
    does an OSError that reaches here (a full disk, a read-only or immutable folder, a full /dev/shm:
    the file the user knows and the condition, :func:`megatron_loop.errors.os_error_line`, not a
    traceback); Ctrl-C (KeyboardInterrupt) prints one line and returns 130. Every writer publishes
    through a temporary name and removes it on the way out, which is why one line is all there is
    to say. No library progress bar when stderr is not a terminal (console.quiet_progress)."""
    quiet_progress()
    # argparse reads "--workers=--" as an empty list of values (it drops the "--"), for every option of every tool:
    # a list where a number or a path was expected fails later as a traceback
    empty = next((a for a in (sys.argv[1:] if argv is None else argv)
                  if isinstance(a, str) and a.startswith("-") and a.partition("=")[2] == "--"), None)
    if empty is not None:
        print_error(f"{empty}: '--' after '=' is no value (argparse takes it for the end of the options); expected "
                    f"{empty.partition('=')[0]}=VALUE")
        return 2
    try:
        return main(argv)
    except (LoopConfigError, LoopDataError) as e:
        print_error(str(e))
        return 2
    except BrokenPipeError:  # the reader of stdout went away (``| head``): nothing left to tell it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush is silent too
        return 1
    except OSError as e:
        print_error(os_error_line(e))
        return 2
    except KeyboardInterrupt:
        print_error(INTERRUPTED)
        return EXIT_INTERRUPTED


def print_error(message: str) -> None:
    """Print ``error: message`` on stderr, once per job on each host: under a launcher every rank
    usually reaches the same error (a config error, rank 0's decision the others follow, a save
    failure every rank was told about) and the first rank of this host to reach it prints it; a
    rank with another message (another cause) prints its own."""
    line = f"error: {message}"
    if _first_to_report(line):
        print(line, file=sys.stderr, flush=True)


def _first_to_report(line: str) -> bool:
    """Whether no other rank of this launch on this host printed ``line`` yet: an exclusively
    created marker file named after the launch (the launcher process every local rank shares:
    torchrun's agent, DeepSpeed's launch.py, slurmstepd; its pid and start time) and the line."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not world.isdigit() or int(world) <= 1:  # one process (a bad WORLD_SIZE is the error being printed)
        return True
    try:
        import hashlib
        import tempfile
        import time

        import psutil

        parent = psutil.Process().parent()
        launch = f"{parent.pid}-{parent.create_time()}" if parent is not None else os.environ.get("MASTER_PORT", "")
        folder = Path(tempfile.gettempdir()) / f"megatron_loop-errors-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        for old in folder.iterdir():  # markers of launches long over
            if old.stat().st_mtime < time.time() - 3600:
                old.unlink(missing_ok=True)
        marker = folder / hashlib.sha256(f"{launch}\0{line}".encode()).hexdigest()[:32]
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except Exception:  # no marker possible (psutil missing, /tmp unwritable): every rank prints
        return True


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask: a SLURM or container allocation, not the machine):
    the bound of every worker-count flag and key (one worker process per core at most)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity mask
        return os.cpu_count() or 1


def check_output_folder(path: str | Path, flag: str, what: str, given: str | Path | None = None) -> None:
    """Before any work: ``path`` is, or can be created as, a folder; an existing file in its place (or
    in place of a parent) is one error line instead of a traceback at the end. ``given``: what the
    user passed as ``flag`` when it is not ``path`` itself (an output prefix inside ``path``)."""
    p = Path(path)
    given = p if given is None else Path(given)
    blocking = next((q for q in (p, *p.absolute().parents) if q.exists()), None)
    if blocking is not None and not blocking.is_dir():
        where = "exists and is not a folder" if blocking.absolute() == given.absolute() else f"{blocking} is a file"
        raise LoopConfigError(f"{flag} {given}: {where}; expected a folder for {what}")


def parse_loop_counts(text: str, flag: str = "--loops") -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]: distinct inference loop counts r >= 1 in increasing order (a
    duplicate or an out-of-order r is a typo that would otherwise be silently merged or re-sorted)."""
    try:
        loops = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise LoopConfigError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if not loops or min(loops) < 1:
        raise LoopConfigError(f"{flag} {text!r}: expected loop counts r >= 1, e.g. 1,2,4,8")
    repeated = sorted({r for r in loops if loops.count(r) > 1})
    if repeated:
        raise LoopConfigError(f"{flag} {text!r}: r={repeated[0]} listed twice; expected distinct loop counts")
    if loops != sorted(loops):
        raise LoopConfigError(f"{flag} {text!r}: expected loop counts in increasing order, e.g. "
                              f"{','.join(map(str, sorted(loops)))}")
    return loops


def read_tool_json(path: str | Path, flag: str, filename: str, tool: str, keys: Sequence[str]) -> dict:
    """A JSON file one of the tools wrote (``path`` may be the folder holding ``filename``), given
    on the command line as ``flag``: one-line errors for a missing, unreadable or foreign file."""
    path = Path(path)
    if path.is_dir():
        path = path / filename
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoopDataError(f"{flag} {path}: not found; expected a {filename} written by {tool} "
                            "(or its folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoopDataError(f"{flag} {path}: not readable JSON ({' '.join(str(e).split())})") from None
    missing = [k for k in keys if k not in data] if isinstance(data, dict) else ["a JSON object"]
    if missing:
        raise LoopDataError(f"{flag} {path}: missing {missing}; expected a {filename} written by {tool}")
    return data
