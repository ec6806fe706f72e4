#!/usr/bin/env python
"""Train a small byte-level BPE tokenizer on a local corpus (see megatron_loop/data/tokenizer.py).

    python tools/train_tokenizer.py --input runs/corpus/train.jsonl --output runs/tokenizer
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from megatron_loop.cli import check_output_folder, run_cli
from megatron_loop.data.sources import ENCODING_ERRORS, iter_local_documents, resolve_local_inputs
from megatron_loop.data.tokenizer import train_bpe_tokenizer
from megatron_loop.errors import LoopDataError


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="local .jsonl/.json/.parquet/.txt file, folder or glob")
    ap.add_argument("--output", required=True, help="folder for the transformers tokenizer files")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--json-key", default="text")
    ap.add_argument("--encoding-errors", choices=ENCODING_ERRORS, default="strict",
                    help="text that is not UTF-8: stop naming the file, line and byte (strict) or read those bytes "
                         "as U+FFFD (replace)")
    args = ap.parse_args(argv)
    check_output_folder(args.output, "--output", "the tokenizer files")
    paths = resolve_local_inputs(args.input)
    if paths is None:
        raise LoopDataError(f"input '{args.input}' not found; expected a local corpus file, folder or glob")
    documents = iter_local_documents(paths, args.json_key, encoding_errors=args.encoding_errors)
    out = train_bpe_tokenizer(documents, args.output, args.vocab_size)
    from tokenizers import Tokenizer

    got = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    if got < args.vocab_size:  # BPE stops when no pair is seen twice: a small corpus gives fewer tokens
        print(f"note: --vocab-size {args.vocab_size:,}: the corpus gave {got:,} tokens (no more pairs seen at least "
              f"twice), so the tokenizer has {got:,}; model.vocab_size must be >= {got:,}", file=sys.stderr)
    print(f"tokenizer saved to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
