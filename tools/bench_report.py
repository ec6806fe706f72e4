#!/usr/bin/env python
"""The markdown reports of the GPU sessions, written again from what their steps left:

    python tools/bench_report.py OUT_DIR [--smoke] [--skip-steps N]                     # REPORT.md (gpu_report.sh)
    python tools/bench_report.py OUT_DIR --first --logs LOGS [--smoke] [--skip-steps N]  # summary.md (gpu_first.sh)

The sessions write them themselves (megatron_loop/gpu); this re-renders a folder brought back from the
device. The renderer is ``megatron_loop.gpu.report_sections`` (what the steps left:
``report_inputs``; the tables, shared with ``tools/bench.py``: ``tables``). No torch import.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from megatron_loop.cli import run_cli
from megatron_loop.gpu.report_sections import write_report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="the folder tools/gpu_report.sh wrote")
    ap.add_argument("--smoke", action="store_true", help="a CPU smoke run: figures are not compared to targets")
    ap.add_argument("--skip-steps", type=int, default=3,
                    help="training steps left out of the medians (compilation, warm-up)")
    ap.add_argument("--budget-s", type=float, default=None, help="the run's time budget (for the header)")
    ap.add_argument("--started", type=float, default=None, help="epoch seconds the run started (for the header)")
    ap.add_argument("--first", action="store_true", help="tools/gpu_first.sh's summary.md instead of REPORT.md")
    ap.add_argument("--logs", default=None, help="the folder of the step logs and device.txt (default OUT_DIR/logs)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    if not (out / "steps.tsv").is_file():
        print(f"error: {out}: no steps.tsv; expected the folder tools/gpu_report.sh wrote", file=sys.stderr)
        return 2
    if args.skip_steps < 0:
        print(f"error: --skip-steps {args.skip_steps}: expected 0 or more", file=sys.stderr)
        return 2
    path = write_report(out, args.first, args.smoke, args.skip_steps, Path(args.logs) if args.logs else None,
                        args.budget_s, args.started)
    print(f"report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
