"""The command-line convention every entry point shares (``pretrain_loop.py`` and ``tools/*.py``): project
errors become one ``error: <message>`` line and exit code 2; and the argument checks several tools
share (output folders, loop lists, the JSON files the tools write)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from megatron_loop.errors import LoopConfigError, LoopDataError


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; a LoopConfigError/LoopDataError prints ``error: ...`` and returns 2."""
    try:
        return main(argv)
    except (LoopConfigError, LoopDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


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
