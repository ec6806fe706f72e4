#!/usr/bin/env python
"""The markdown reports of the GPU scripts: every GPU target's figure, its device and its ratio to the target.

    python tools/bench_report.py OUT_DIR [--smoke] [--skip-steps N]                     # gpu_report.sh: REPORT.md
    python tools/bench_report.py OUT_DIR --first --logs LOGS [--smoke] [--skip-steps N]  # gpu_first.sh: summary.md

Reads what the steps left -- ``steps.tsv`` (per step: id, status, exit code, seconds, limit,
command), each ``tools/bench.py`` step's JSON, each training run's ``metrics.jsonl`` and log, the
device (``device.txt`` beside the logs) -- and writes ``OUT_DIR/REPORT.md`` or, with ``--first``,
``OUT_DIR/summary.md`` (through a temporary file). A step that failed, ran out of time or was
skipped is reported as such, with the last error line of its log. Every training figure is printed
beside the device it came from and the activation-recomputation plan the run logged (``auto`` plans
differently on an H100 and an H200); the targets are for one H100, so a figure from another device
gets no verdict.

The report is built by the bench package (``tools/benchmarks/report_inputs.py``: what the steps
left and the targets; ``report_sections.py``: the markdown); what ``tools/bench.py`` and the reports
share is ``tools/benchmarks/tables.py``. Nothing here imports torch: the report is written even when
a step broke.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.report_inputs import Inputs  # tools/benchmarks, beside this script
from benchmarks.report_sections import render, render_first
from benchmarks.tables import cpu_name, git_commit, markdown_table, train_summary  # noqa: F401  (shared)


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
    inp = Inputs(out, args.skip_steps, Path(args.logs) if args.logs else None, in_file_order=args.first)
    name = "summary.md" if args.first else "REPORT.md"
    text = (render_first if args.first else render)(inp, args.smoke, args.budget_s, args.started)
    tmp = out / f"{name}.tmp"
    tmp.write_text(text)
    tmp.replace(out / name)
    print(f"report written to {out / name}")
    return 0


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))
