"""``python -m megatron_loop.gpu first|report OUT_DIR [--smoke]``: one GPU session (tools/gpu_first.sh,
tools/gpu_report.sh are its entry points)."""

from __future__ import annotations

import os
import sys

from .session import UsageError, output_folder

SCRIPTS = {"first": "tools/gpu_first.sh", "report": "tools/gpu_report.sh"}


def main(argv: list[str]) -> int:
    session = argv[0] if argv and argv[0] in SCRIPTS else None
    usage = f"usage: bash {SCRIPTS.get(session or '', 'tools/gpu_first.sh')} OUT_DIR [--smoke]"
    args = argv[1:]
    try:
        if session is None or not 1 <= len(args) <= 2:
            raise UsageError(usage)
        if len(args) == 2 and args[1] != "--smoke":
            raise UsageError(f"unknown option '{args[1]}'; {usage}")
        smoke = len(args) == 2 or (session == "report" and os.environ.get("GPU_REPORT_DEVICE", "cuda") == "cpu")
        out = output_folder(args[0])
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if session == "first":
        from .first import run
    else:
        from .second import run
    return run(out, smoke)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
