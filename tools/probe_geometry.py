#!/usr/bin/env python
"""Geometry probes of recurrent dynamics, paper App. C.4 (see megatron_loop/probes/cli.py).

    python tools/probe_geometry.py --checkpoint CKPT_DIR --valid-prefix data/val --loops 1,2,4,8 \
        --num-sequences 49 --num-positions 100000 --seq-length 2048 --output probe/
    python tools/probe_geometry.py --model HF_DIR ...
"""

from __future__ import annotations

import sys

from megatron_loop.cli import run_cli


def main(argv=None) -> int:
    # imported here, not at the top: run_cli sets TQDM_DISABLE (console.quiet_progress) before tqdm is first
    # imported, which reads it once
    from megatron_loop.probes.cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(run_cli(main))
