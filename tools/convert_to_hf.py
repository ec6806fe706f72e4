#!/usr/bin/env python
"""Export a DeepSpeed training checkpoint (any ZeRO stage) as a Hugging Face model folder.

    python tools/convert_to_hf.py --checkpoint runs/tiny/checkpoints --output runs/tiny/hf
    python -c "from transformers import AutoModelForCausalLM as A; \\
               A.from_pretrained('runs/tiny/hf', trust_remote_code=True, num_loops=6)"

Writes config.json (model_type looplm, auto_map), modeling_looplm.py, sharded safetensors,
the tokenizer (``--tokenizer`` or the run config's data.tokenizer) and generation_config.json.
A NonLoop model without conditioning becomes a native LlamaForCausalLM / Qwen3ForCausalLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True,
                    help="a run's checkpoints/ folder (the checkpoint 'latest' names, verified against its "
                         "manifest; the newest complete one if it is damaged) or one global_step* folder in it")
    ap.add_argument("--output", required=True, help="HF folder to create (must be empty or new)")
    ap.add_argument("--tag", help="checkpoint tag (default: the one in 'latest'); a named checkpoint must verify")
    ap.add_argument("--tokenizer", help="tokenizer folder or hub name (default: data.tokenizer of the run)")
    ap.add_argument("--max-shard-size", default="2GB", help="safetensors shard size, e.g. 500MB")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export in --output (only a folder this tool exported, with nothing "
                         "added since; never a run folder, a checkpoint or a folder with other files)")
    args = ap.parse_args(argv)
    from megatron_loop.console import quiet_progress

    quiet_progress()  # no shard-loading / writing bars in a log (stderr not a terminal)

    # Cheap checks first: the conversion imports DeepSpeed and megatron-core (seconds).
    from megatron_loop.checkpoint.selection import checkpoint_folder_problem
    from megatron_loop.errors import LoopConfigError, LoopDataError

    ckpt, out = Path(args.checkpoint), Path(args.output)
    problem = checkpoint_folder_problem(ckpt)  # missing, a file, an HF export
    if problem:
        return _fail(problem)
    if not args.output.strip():
        return _fail(f"--output {args.output!r}: expected the path of a folder for the export (e.g. RUN/hf)")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        from megatron_loop.export.output_folder import check_not_a_run  # a run folder: said before "pass --overwrite"

        try:
            check_not_a_run(out)
        except LoopDataError as e:
            return _fail(str(e))
        return _fail(f"{out}: output folder is not empty; pass --overwrite to replace it")
    shard_size = _shard_size(args.max_shard_size)
    if shard_size is None:
        return _fail(f"--max-shard-size {args.max_shard_size!r}: expected a positive size such as 500MB, 2GB, "
                     "1GiB or a number of bytes")

    # after the argument checks: they answer without importing torch and transformers
    from megatron_loop.data.tokenizer import check_tokenizer_location

    try:
        if args.tokenizer:
            check_tokenizer_location(args.tokenizer)
        from megatron_loop.export.convert import convert_checkpoint

        path = convert_checkpoint(ckpt, out, tag=args.tag, tokenizer=args.tokenizer, overwrite=args.overwrite,
                                  max_shard_size=shard_size)
    except (LoopConfigError, LoopDataError) as e:
        return _fail(str(e))
    print(f"exported {ckpt} -> {path}")
    return 0


def _shard_size(text: str) -> int | None:
    """Bytes of ``--max-shard-size`` as transformers reads it (500MB, 2GB, 1GiB, or plain bytes); None if invalid."""
    from transformers.utils.hub import convert_file_size_to_int

    try:
        size = int(text) if text.isdigit() else convert_file_size_to_int(text)
    except ValueError:
        return None
    return size if size > 0 else None


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))
