"""Shared CLI convention: project errors become one ``error: <message>`` line and exit code 2."""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from megatron_loop.errors import LoopConfigError, LoopDataError


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; a LoopConfigError/LoopDataError prints ``error: ...`` and returns 2."""
    try:
        return main(argv)
    except (LoopConfigError, LoopDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


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
