#!/usr/bin/env python
"""Train a LoopLM.

    deepspeed pretrain_loop.py --config examples/llama_4x5.yaml [--set key.path=value ...]
    python pretrain_loop.py --config FILE --dry-run [--data-parallel-size 8]   # checks + the start-up statement
    python pretrain_loop.py --config FILE --dry-run --json   # the same numbers as one JSON line
    python pretrain_loop.py --config FILE --dry-run --skip-data-check   # a paper config without its data
    python pretrain_loop.py --config FILE --print-config [--set ...]  # the resolved config, then exit
    python pretrain_loop.py --list-configs [--details]   # the paper's runs (megatron_loop/registry/)
    torchrun --nproc_per_node 2 pretrain_loop.py --config FILE        # also: plain python, srun

The loop lives in ``megatron_loop.training``; errors in the config or data print one
``error: ...`` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from megatron_loop.cli import run_cli
from megatron_loop.config import load_config
from megatron_loop.dryrun import dry_run_report, dry_run_text
from megatron_loop.registry import list_configs
from megatron_loop.training import main as train_main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (see examples/)")
    p.add_argument("--list-configs", action="store_true",
                   help="print every paper run of the registry: its name and YAML file (indexed in "
                        "examples/paper/README.md)")
    p.add_argument("--details", action="store_true",
                   help="with --list-configs: also each run's family, layout, depths, conditioning, parameters, "
                        "loop sweep and paper figures/tables")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. --set model.train_loops=3 (repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config and the files it names and print what training would state at start: "
                        "the model, the plan and the layout (fast: builds nothing; --json: as one JSON line)")
    p.add_argument("--json", action="store_true",
                   help="with --dry-run: print its numbers (parameter counts, batch arithmetic, plan, files) as one "
                        "JSON line instead")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (YAML + --set overrides + backbone preset + defaults) as JSON, "
                        "as training prints it at start, and exit without training")
    p.add_argument("--skip-data-check", action="store_true",
                   help="with --dry-run: do not check the data prefixes and the tokenizer files (plan a paper config "
                        "before its tokenised data exists); everything else is checked")
    p.add_argument("--data-parallel-size", type=int, default=None, metavar="N",
                   help="with --dry-run: plan for N data-parallel ranks (default: $WORLD_SIZE, $SLURM_NTASKS or 1)")
    p.add_argument("--resume", default=None, metavar="PATH",
                   help="resume from this checkpoint folder (a run's checkpoints/ or one global_step* in it); "
                        "default: the newest complete checkpoint of train.output_dir when train.resume is true")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.data_parallel_size is not None and not args.dry_run:
        p.error("--data-parallel-size: only with --dry-run (training takes the launcher's world size)")
    if args.details and not args.list_configs:
        p.error("--details: only with --list-configs")
    if args.json and not args.dry_run:
        p.error("--json: only with --dry-run")
    if args.skip_data_check and not args.dry_run:
        p.error("--skip-data-check: only with --dry-run (training reads the data)")
    return args


def print_to_pipe(text: str) -> None:
    """``print`` that lets the reader stop early (``--list-configs | head``) without a BrokenPipeError."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # The reader is gone: point stdout at /dev/null so the interpreter's final flush is silent too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_configs:
        print_to_pipe(list_configs(args.details))
        return 0
    if args.config is None:
        print("error: --config FILE is required (or --list-configs)", file=sys.stderr)
        return 2
    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print_to_pipe(cfg.dumps())
        return 0
    if args.dry_run:
        report = dry_run_report(cfg, args.data_parallel_size, check_data=not args.skip_data_check)
        print(json.dumps(report) if args.json else dry_run_text(cfg, report))
        return 0
    return train_main(cfg, args)


def main(argv: list[str] | None = None) -> int:
    """The project's CLI convention (``megatron_loop.cli.run_cli``): a config or data error is one
    ``error: ...`` line and exit code 2."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
