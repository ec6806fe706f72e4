#!/usr/bin/env python
"""The paired, item-level loop study (docs/REPRODUCE.md, ``finding1_paired``): the paper's first
finding as the paper measures it (Sec. 3, Fig. 1(a)).

    python tools/paired_study.py plan --study finding1_paired         # the pre-registered plan
    python tools/paired_study.py eval --model RUN/NAME/hf --loops 1,2,...,16 --include-path RUN/corpus/eval \\
        --tasks compose,facts --valid-prefix RUN/data/corpus_valid --output RUN/NAME/paired
    python tools/paired_study.py analyse --study finding1_paired --run RUN

``eval`` scores every item of the tasks at every r on the exported model (lm-eval's multiple
choice, ``megatron_loop/eval/paired.py``) and writes ``OUTPUT/items.json`` (each item's 0/1 outcome
per r, and the held-out loss per r). ``analyse`` reads every model and seed of the study and
writes ``RUN/summary.json``, ``RUN/summary.md`` and the figures ``RUN/paired_*.png``: per seed the
paired item-level changes from r = K, combined over seeds with a hierarchical bootstrap, and the
plan's verdict (``eval/paired_stats.py``, ``eval/paired_report.py``); ``--available-only`` analyses
a study cut short, listing the runs that did not finish. ``bash tools/small_study.sh finding1_paired`` runs all of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

from megatron_loop.cli import parse_loop_counts, run_cli
from megatron_loop.errors import LoopConfigError

ROOT = Path(__file__).resolve().parents[1]


def _paired_study(name: str):
    from megatron_loop import registry as R

    if name not in R.STUDIES or R.STUDIES[name].paired is None:
        paired = ", ".join(s.name for s in R.STUDY_LIST if s.paired is not None)
        raise LoopConfigError(f"--study {name!r}: expected a paired study ({paired})")
    return R.STUDIES[name]


def _run(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the study's pre-registered analysis plan")
    plan.add_argument("--study", required=True)
    ev = sub.add_parser("eval", help="every item's outcome at every r of one exported model")
    ev.add_argument("--model", required=True, help="HF folder written by tools/convert_to_hf.py")
    ev.add_argument("--loops", required=True, help="comma-separated loop counts r")
    ev.add_argument("--include-path", required=True, help="the corpus's eval folder (tools/make_corpus.py)")
    ev.add_argument("--tasks", default="compose,facts", help="bundled task keys (files <include-path>/<key>.jsonl)")
    ev.add_argument("--valid-prefix", help="indexed validation prefix for the held-out loss per r")
    ev.add_argument("--seq-length", type=int, default=None, help="held-out windows (default: the export's)")
    ev.add_argument("--valid-sequences", type=int, default=None)
    ev.add_argument("--batch-size", type=int, default=64)
    ev.add_argument("--label", default=None)
    ev.add_argument("--output", required=True, help="folder for items.json")
    an = sub.add_parser("analyse", help="paired changes over the study's models and seeds; tables and figures")
    an.add_argument("--study", required=True)
    an.add_argument("--run", required=True, help="the study's folder (STUDY_RUN of tools/small_study.sh)")
    an.add_argument("--models", default=None, help="only these twins (space- or comma-separated)")
    an.add_argument("--seeds", default=None, help="only these seeds (space- or comma-separated)")
    an.add_argument("--available-only", action="store_true",
                    help="analyse the runs whose items.json exists and list the others as not run (a study cut short)")
    an.add_argument("--post-hoc-all-runs", action="store_true",
                    help="exploratory, not the registered test: every run with the exclusion rule switched off, "
                         "written to RUN/post_hoc_all_runs/")
    a = ap.parse_args(argv)

    if a.command == "plan":
        print(_paired_study(a.study).paired.text())
        return 0
    if a.command == "eval":
        from megatron_loop.atomic import write_atomic
        from megatron_loop.eval.paired import ITEMS_FILE, sweep_items

        loops = parse_loop_counts(a.loops)
        out = sweep_items(a.model, loops, [t for t in a.tasks.split(",") if t], a.include_path, a.valid_prefix,
                          a.seq_length, a.valid_sequences, a.batch_size, a.label)
        write_atomic(Path(a.output) / ITEMS_FILE, json.dumps(out) + "\n")
        print(f"wrote {Path(a.output) / ITEMS_FILE}")
        return 0
    from megatron_loop.eval.paired_report import write_report
    from megatron_loop.eval.paired_stats import analyse

    study = _paired_study(a.study)
    split = lambda text: [x for x in text.replace(",", " ").split() if x] if text else None  # noqa: E731
    seeds = split(a.seeds)
    try:
        seeds = None if seeds is None else [int(x) for x in seeds]
    except ValueError:
        raise LoopConfigError(f"--seeds {a.seeds!r}: expected integers") from None
    out = Path(a.run)
    if a.post_hoc_all_runs:
        study, out = dataclasses.replace(study, paired=study.paired.post_hoc_all_runs()), out / "post_hoc_all_runs"
    summary = analyse(study, Path(a.run), split(a.models), seeds, a.available_only)
    paths = write_report(summary, out)
    print((out / "summary.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
