#!/usr/bin/env python
"""Evaluate an exported LoopLM across inference loop counts r (paper Sec. 2.3, App. C.3): the command line of
megatron_loop/eval/cli.py, whose docstring (``--help``) says what it does.

    python tools/eval_loops.py --model runs/tiny/hf --loops 1,2,4,8 --limit 200 --output runs/tiny/eval
"""

from __future__ import annotations

import sys

from megatron_loop.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
