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
