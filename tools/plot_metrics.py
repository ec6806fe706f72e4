#!/usr/bin/env python
"""Draw training curves from metrics.jsonl: loss (log y, with validation loss per r), learning rate,
gradient norm, throughput and MFU, one colour per run, several runs on one figure.

    python tools/plot_metrics.py runs/tiny_2x3 --output runs/tiny_2x3/curves.png
    python tools/plot_metrics.py runs/a runs/b/metrics.jsonl --labels "2x3,1+2x3+1" --x tokens --output cmp.png

Each RUN is a training output folder (train.output_dir) or its metrics.jsonl, labelled by what the run
is (name, layout p+sxK+c, conditioning: recorded by training at start). The learning rate is drawn
at every step from the schedule the run recorded (warmup included), the logged samples on it.
Lines that are not records and values that cannot be drawn are left out with a warning naming
their line numbers; a file with nothing to draw is an error. Runs that recorded loop dynamics
(logging.dynamics_interval) also get OUTPUT_dynamics.png (.pdf / .svg as OUTPUT): per-loop relative
updates and state norms, the held-out batch loss at r = K - 1, K, K + 1, and the timestep gates per loop.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folder (train.output_dir) or metrics.jsonl")
    ap.add_argument("--output", default="metrics.png", help="figure to write: .png, .pdf or .svg (default: metrics.png)")
    ap.add_argument("--labels", default=None,
                    help="comma-separated legend labels, one per RUN (default: what each run is, as its training "
                         "recorded it: NAME (p+sxK+c, conditioning); runs written before that: the run folder "
                         "names, NAME for runs/NAME/train)")
    ap.add_argument("--x", default="step", help="x axis: step (default) or tokens (in millions)")
    args = ap.parse_args(argv)

    # after parsing: --help and usage errors answer without importing matplotlib
    from megatron_loop.errors import LoopConfigError, LoopDataError
    from megatron_loop.curves import plot_dynamics, plot_runs, read_run, save_figure

    try:
        labels = args.labels.split(",") if args.labels else [None] * len(args.runs)
        if len(labels) != len(args.runs):
            raise LoopConfigError(f"--labels {args.labels!r}: {len(labels)} labels for {len(args.runs)} runs; "
                                  "expected one per RUN")
        runs = [read_run(path, label) for path, label in zip(args.runs, labels)]
        files = [run.path.resolve() for run in runs]  # a folder and its metrics.jsonl are one run
        twice = next((i for i, f in enumerate(files) if f in files[:i]), None)
        if twice is not None:  # two identical curves under one label, the second hiding the first
            raise LoopConfigError(f"RUN {args.runs[twice]!r}: the run of {args.runs[files.index(files[twice])]!r} "
                                  "again; expected each run once")
        figure = plot_runs(runs, args.x)
        for run in runs:  # skipped lines and values, one line per kind, named by line number
            for warning in run.warnings:
                print(warning, file=sys.stderr)
        out = save_figure(figure, args.output)
        dynamics = plot_dynamics(runs)
        if dynamics is not None:
            dynamics_out = save_figure(dynamics, out.with_name(f"{out.stem}_dynamics{out.suffix}"))
    except (LoopConfigError, LoopDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({', '.join(r.label for r in runs)})")
    if dynamics is not None:
        print(f"wrote {dynamics_out} (loop dynamics of {', '.join(r.label for r in runs if r.dynamics)})")
    return 0


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))
