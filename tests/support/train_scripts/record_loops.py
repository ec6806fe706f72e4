"""``pretrain_loop.py`` that records the depth arguments of every training forward, per rank.

    python tests/support/train_scripts/record_loops.py OUT_PREFIX [pretrain_loop.py arguments]

Appends one JSON line ``[num_loops, backprop_loops, timestep_grid, initial_state_seed]`` (the forward's
:class:`~megatron_loop.model.options.LoopOptions`) per training micro-batch
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
    from megatron_loop.model.options import LoopOptions

    forward = LoopLM.forward
    calls: list[list] = []

    def recording(self, input_ids, labels=None, options=None, **fields):
        if self.training:  # the options a training step passes (training/step.py), whole
            run = LoopOptions.of(options, fields)
            calls.append([run.num_loops, run.backprop_loops, run.timestep_grid, run.initial_state_seed])
        return forward(self, input_ids, labels, options, **fields)

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
