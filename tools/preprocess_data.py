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
from megatron_loop.console import quiet_progress

if __name__ == "__main__":
    quiet_progress()  # no library bars in a log: before tqdm is first imported (it reads TQDM_DISABLE then)
    from megatron_loop.data.preprocess import main

    sys.exit(run_cli(main))
