#!/usr/bin/env python
"""Tokenise documents into Megatron indexed datasets (see megatron_loop/data/preprocess.py).

    python tools/preprocess_data.py --input runs/corpus/train.jsonl --tokenizer runs/tokenizer \
        --output-prefix runs/data/corpus --workers 2 --validation-documents 200
    python tools/preprocess_data.py --input HuggingFaceFW/fineweb-edu --hf-config sample-350BT \
        --streaming --max-documents 1000000 --tokenizer meta-llama/Llama-3.1-8B \
        --output-prefix data/fineweb_llama --workers 16
"""

from __future__ import annotations

import sys

from megatron_loop.cli import run_cli


def main(argv=None) -> int:
    # imported here, not at the top: run_cli sets TQDM_DISABLE (console.quiet_progress) before tqdm is first
    # imported, which reads it once
    from megatron_loop.data.preprocess import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(run_cli(main))
