#!/usr/bin/env python
"""Geometry probes of recurrent dynamics, paper App. C.4 (see megatron_loop/probes/cli.py).

    python tools/probe_geometry.py --checkpoint CKPT_DIR --valid-prefix data/val --loops 1,2,4,8 \
        --num-sequences 49 --num-positions 100000 --seq-length 2048 --output probe/
    python tools/probe_geometry.py --model HF_DIR ...
"""

from __future__ import annotations

import sys
import warnings

# megatron-core warns on import when Transformer Engine / Apex are absent; errors stay one line.
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

from megatron_loop.data.cli import run_cli  # noqa: E402
from megatron_loop.probes.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
