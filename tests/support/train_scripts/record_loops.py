"""``pretrain_loop.py`` that records the depth arguments of every training forward, per rank.

    python tests/support/train_scripts/record_loops.py OUT_PREFIX [pretrain_loop.py arguments]

Appends one JSON line ``[num_loops, backprop_loops, timestep_grid, initial_state_seed]`` per training
micro-batch
to ``OUT_PREFIX.rank{RANK}.jsonl`` (the sampled-loop tests compare ranks, steps and resumes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support
from testpaths import REPO  # noqa: E402

sys.path.insert(0, str(REPO))


def main() -> int:
    launcher_args = [a for a in sys.argv[1:] if a.startswith("--local_rank")]
    rest = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    out, argv = Path(rest[0]), launcher_args + rest[1:]
    from megatron_loop.model.looplm import LoopLM

    forward = LoopLM.forward
    calls: list[list] = []

    def recording(self, *args, **kwargs):
        if self.training:
            calls.append([kwargs.get("num_loops"), kwargs.get("backprop_loops"), kwargs.get("timestep_grid"),
                          kwargs.get("initial_state_seed")])
        return forward(self, *args, **kwargs)

    LoopLM.forward = recording
    import pretrain_loop

    try:
        return pretrain_loop.main(argv)
    finally:
        path = out.with_name(f"{out.name}.rank{os.environ.get('RANK', '0')}.jsonl")
        with path.open("a") as f:
            f.writelines(json.dumps(c) + "\n" for c in calls)


if __name__ == "__main__":
    sys.exit(main())
