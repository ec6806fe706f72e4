"""Evaluate an exported LoopLM across inference loop counts r (paper Sec. 2.3, App. C.3).

    python tools/eval_loops.py --model runs/tiny/hf --loops 1,2,4,8 --limit 200 --output runs/tiny/eval
    python tools/eval_loops.py --model HF --loops 1,3,6 --tasks clutrr=looplm_clutrr_local \\
        --include-path runs/corpus/eval --valid-prefix runs/data/train_valid --seq-length 256

The model is loaded once; for each r it runs lm-evaluation-harness zero-shot on the paper's
groups (Knowledge: sciq, arc_easy, piqa; Reasoning: arc_challenge, winogrande, openbookqa,
hellaswag, commonsense_qa, proofwriter, clutrr, bbh) and, with --valid-prefix, the held-out
loss. ``--tasks`` takes paper task keys, ``KEY=LM_EVAL_TASK`` (another task in that slot,
e.g. a local file-backed one) or extra lm-eval task names (``NAME[:acc|acc_norm]``);
``--tasks none`` skips lm-eval. The paper tasks read their datasets from the Hugging Face hub
(cached after the first run); offline, pass local tasks as in the second example. Prints a
task x r table (score ± standard error) and writes results.json, results.csv, per_depth.csv
and PNG plots into --output (default: <model>_eval next to the model folder); --compare adds
other runs' results.json to the shared figures.

Where the model's recurrent trajectory does not depend on r (no timestep conditioning, or the
``prefix`` timestep grid with r <= K), every r comes from one forward per batch at the largest r
that reads the Coda and the head after each requested loop (bitwise the numbers of one pass per r;
``megatron_loop/eval/one_pass.py``); otherwise (the ``rescaled`` grid: t_l = l/r) one pass per r.
The sweep prints which (``loop sweep: ...``) and records it in results.json ``sweep_passes``;
``--per-r`` forces one pass per r.

Per-token adaptive exit (``model/adaptive_exit.py``): ``--exit-criterion kl|cosine --exit-thresholds 1e-4,1e-3``
(or Ouro's Q-exit on a learned exit gate: ``--exit-criterion q_exit --exit-thresholds 0.5,0.7,0.9``)
evaluates the same suite once per threshold with r capped at --exit-max-loops (default: the
largest --loops) and adds, per threshold, the mean loops per token, the effective depth it
implies and the scores (results.json "adaptive", adaptive.csv, frontier.png: score against mean
effective depth with the fixed-r curve on the same axes).

    python tools/eval_loops.py --model HF --loops 1,2,3,4,6 --exit-criterion kl --exit-thresholds 1e-3,1e-2
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Sequence

from megatron_loop.atomic import clean_leftovers
from megatron_loop.cli import parse_loop_counts, run_cli
from megatron_loop.config.validation import MAX_LOOPS
from megatron_loop.console import show_progress
from megatron_loop.errors import LoopConfigError


def _limit(text: str | None) -> int | float | None:
    """``--limit``: items per task (integer >= 1) or a fraction of each task (0 < x < 1)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < 1 or (value >= 1 and value == int(value))):
        raise LoopConfigError(f"--limit {text}: expected a number of items per task (an integer >= 1) or a "
                              "fraction of each task in (0, 1)")
    return int(value) if value >= 1 else value


def default_output(model: str) -> Path:
    """``<model>_eval`` next to the model folder, so results never mix with the export's files."""
    folder = Path(model).resolve()
    return folder.parent / f"{folder.name}_eval"


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; project errors become one ``error: ...`` line and exit code 2."""
    return run_cli(_run, argv)


def _run(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF folder written by tools/convert_to_hf.py")
    ap.add_argument("--loops", required=True, help="comma-separated loop counts r, e.g. 1,2,4")
    ap.add_argument("--tasks", default=None, help="comma-separated; default: the eleven paper tasks; 'none': skip")
    ap.add_argument("--limit", default=None, help="items per lm-eval task (int) or fraction (<1)")
    ap.add_argument("--include-path", action="append", default=[], help="extra lm-eval task folder (repeatable)")
    ap.add_argument("--valid-prefix", help="indexed validation prefix (P.bin/P.idx) for held-out loss")
    ap.add_argument("--seq-length", type=int, default=None,
                    help="packed sequence length for held-out loss (default: the training length the export "
                         "records, train_seq_length)")
    ap.add_argument("--valid-sequences", type=int, default=None, help="at most this many packed sequences")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    ap.add_argument("--output", default=None, help="results folder (default: <model>_eval next to the model), "
                                                    "replaced whole when the sweep finishes; meanwhile results.json "
                                                    "is written to OUTPUT.partial after each r, and a sweep "
                                                    "interrupted or run again with the same settings resumes from it")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the results of another sweep in --output instead of stopping")
    ap.add_argument("--label", default=None, help="the model's name on the figures (default: the run's name as "
                                                  "training recorded it in the export, else NAME of runs/NAME/hf)")
    ap.add_argument("--compare", action="append", default=[], help="another run's results.json for the figures "
                                                                    "(refused if it ran other tasks, --limit or items)")
    ap.add_argument("--compare-mismatched", action="store_true",
                    help="draw --compare runs of other tasks, --limit or items anyway (a warning each; the legend "
                         "gives every run's n)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--per-r", action="store_true",
                    help="one pass per r even where one forward could serve every r (the trajectory does not "
                         "depend on r: no timestep conditioning, or the prefix grid with r <= K); the numbers are "
                         "the same, bitwise, only slower")
    ap.add_argument("--exit-criterion", default="none", choices=("none", "kl", "cosine", "q_exit"),
                    help="per-token adaptive exit criterion (default none: fixed r only; q_exit: Ouro's Q-exit on "
                         "a learned exit gate)")
    ap.add_argument("--exit-mode", default=None, choices=("readout", "freeze"),
                    help="how an exit acts (default: the export's; q_exit: readout, Ouro's every loop for every token "
                         "then the per-token readout; kl, cosine: freeze, exited tokens stop and lend their last "
                         "keys/values, which saves compute)")
    ap.add_argument("--exit-thresholds", default=None, help="comma-separated exit thresholds, e.g. 1e-4,1e-3 "
                                                            "(q_exit: probabilities, e.g. 0.5,0.7,0.9)")
    ap.add_argument("--exit-max-loops", type=int, default=None, help="loop cap r under adaptive exit "
                                                                     "(default: the largest --loops)")
    ap.add_argument("--no-loop-limit", action="store_true",
                    help="allow r above 16 x the training loop count K (refused by default: a forward at r costs "
                         "L(r)/L(K) forwards at the training depth)")
    args = ap.parse_args(argv)
    # One bar, the sweep's own over r (on a terminal, console.show_progress); lm-eval's nested bars per task
    # and per request, and datasets' and transformers', are off: tqdm reads this when it is first imported.
    os.environ.setdefault("TQDM_DISABLE", "1")

    # after parsing (and TQDM_DISABLE): --help and usage errors answer without torch, lm-eval, matplotlib
    from megatron_loop.config.naming import run_folder_name
    from megatron_loop.eval.adaptive import (check_adaptive, format_adaptive_table, parse_thresholds,
                                             run_adaptive_sweep, write_adaptive_outputs)
    from megatron_loop.eval.plots import model_label, write_all_plots
    from megatron_loop.eval.report import (check_comparable, check_output, format_differences, format_table,
                                           partial_folder, publish, read_results, write_results, write_results_json)
    from megatron_loop.eval.sweep import (SweepSettings, check_loop_limit, limit_warnings, open_session,
                                          resolve_seq_length, run_sweep, sweep_fingerprint)
    from megatron_loop.export.load import export_config
    from megatron_loop.eval.tasks import resolve_tasks

    items = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    if items == []:  # --tasks '' would run the eleven hub tasks of the default
        raise LoopConfigError(f"--tasks {args.tasks!r}: expected task names (e.g. facts,clutrr=looplm_clutrr_local), "
                              "'none' for the held-out loss only, or no --tasks for the paper's eleven")
    tasks = [] if items == ["none"] else resolve_tasks(items)
    settings = SweepSettings(loops=parse_loop_counts(args.loops), tasks=tasks, limit=_limit(args.limit),
                             include_paths=args.include_path, valid_prefix=args.valid_prefix,
                             seq_length=args.seq_length, valid_sequences=args.valid_sequences,
                             batch_size=args.batch_size, progress=show_progress(not args.no_progress), device=args.device,
                             dtype=args.dtype, one_pass=not args.per_r)
    others = [read_results(p) for p in args.compare]
    # cheap first: tasks and --limit are known before the sweep (items after it, below)
    planned = {"tasks": {t.key: {} for t in settings.tasks}, "limit": settings.limit}
    check_comparable(planned, [(p, {**o, "items": {}}) for p, o in zip(args.compare, others)], args.compare_mismatched)
    thresholds = None
    if args.exit_mode is not None and args.exit_criterion == "none":
        raise LoopConfigError("--exit-mode: expected --exit-criterion kl, cosine or q_exit with it")
    if args.exit_criterion != "none" or args.exit_thresholds is not None:
        if args.exit_criterion == "none":
            raise LoopConfigError("--exit-thresholds: expected --exit-criterion kl, cosine or q_exit with it")
        thresholds = parse_thresholds(args.exit_thresholds or "", args.exit_criterion)
    for flag, r in (("--loops", max(settings.loops)), ("--exit-max-loops", args.exit_max_loops)):
        if r is not None and r > MAX_LOOPS:  # the export refuses them (LoopLMConfig.num_loops), even unlimited
            raise LoopConfigError(f"{flag} {r}: expected loop counts of at most {MAX_LOOPS}, the export's largest "
                                  "num_loops (--no-loop-limit lifts only the 16 K limit)")
    config = export_config(args.model)
    if not args.no_loop_limit:  # before the model loads: --loops 100000 would run for hours without a word
        check_loop_limit(args.model, config, {"--loops": max(settings.loops), "--exit-max-loops": args.exit_max_loops})
    for line in resolve_seq_length(settings, args.model, config):
        print(line, file=sys.stderr)
    # The output before any work: a finished or interrupted sweep there is resumed or refused, never lost.
    # The sweep writes into OUTPUT.partial and swaps it in for OUTPUT, whole, when done (report.publish).
    output = Path(args.output) if args.output else default_output(args.model)
    for note in clean_leftovers(output):  # a publish killed between its two renames: the old set put back
        print(note, file=sys.stderr)
    fingerprint = sweep_fingerprint(args.model, settings)
    previous, source = check_output(output, fingerprint, args.overwrite)
    if previous is not None:
        kept = [r for r in previous["loops"] if r in settings.loops]
        extra = [r for r in previous["loops"] if r not in settings.loops]
        print(f"resuming the sweep in {source}: r = {', '.join(map(str, kept)) or 'none'} already "
              "done" + (f"; keeping r = {', '.join(map(str, extra))} from the earlier sweep" if extra else ""),
              file=sys.stderr)
    todo = [r for r in settings.loops if previous is None or r not in previous["loops"]]
    session = None
    if todo or thresholds is not None:  # one load for the fixed-r and the adaptive sweeps
        session = open_session(args.model, settings)
        for line in limit_warnings(settings, session.tasks):
            print(line, file=sys.stderr)
    if thresholds is not None:
        max_loops = max(settings.loops) if args.exit_max_loops is None else args.exit_max_loops
        check_adaptive(session, args.exit_criterion, max_loops)  # before the fixed-r sweep spends any time

    staging = partial_folder(output)

    def save(partial: dict) -> None:
        write_results_json({**partial, "sweep_settings": fingerprint}, staging)

    # the model's name on the figures: --label, else what training called the run (the export records it),
    # else its folder (NAME of runs/NAME/hf)
    label = args.label or config.get("run_name") or run_folder_name(args.model)
    results = run_sweep(session, settings, label=label, previous=previous, on_result=save,
                        on_passes=lambda passes: print(passes.line(), file=sys.stderr))
    results["sweep_settings"] = fingerprint
    if thresholds is not None:
        results["adaptive"] = run_adaptive_sweep(session, settings, args.exit_criterion, thresholds, max_loops,
                                                 args.exit_mode)
    for warning in check_comparable(results, list(zip(args.compare, others)), allow=True):
        print(warning, file=sys.stderr)  # refused above unless --compare-mismatched; items differ: said here
    paths = write_results(results, staging)
    plots = write_all_plots(results, staging, others)
    if results.get("adaptive"):  # also kept from an earlier call: the folder is replaced whole
        plots += write_adaptive_outputs(results, staging, others)
    publish(output)
    print(f"\n{results['layout']} (K={results['train_loops']}, L(r) = effective depth), "
          f"scores in % ± standard error, limit {results['limit']}")
    print(format_table(results))
    for other in others:  # what differs, on the console: the figures draw the runs side by side
        print("\n" + format_differences(results, other, model_label(results), model_label(other)))
    if thresholds is not None:
        print(format_adaptive_table(results))
    print(f"wrote {', '.join(p.name for p in [*paths.values(), *plots])} to {output}")
    return 0

