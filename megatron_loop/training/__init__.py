"""Training: the loop, atomic checkpoints, metrics, signals, distributed setup (issues 5 and 9).

    from megatron_loop import load_config
    from megatron_loop.training import main
    main(load_config("examples/tiny_2x3.yaml"), argparse.Namespace(resume=None))

Modules: ``loop`` (train steps, validation, NaN policy), ``checkpoint`` (atomic save with a
manifest, verified resume, keep-last-N, RNG state), ``metrics`` (JSONL, wandb, tqdm),
``signals`` (SIGTERM/SIGUSR1/wall time), ``distributed`` (launcher-agnostic init),
``preflight`` (checks before anything is written).
"""

from __future__ import annotations

import sys


def main(cfg, args) -> int:
    """Entry point behind ``pretrain_loop.py``; returns the exit code.

    Config/data errors propagate as ``LoopConfigError``/``LoopDataError`` (the CLI prints one
    ``error:`` line, exit 2); a stop on non-finite values prints one and returns 3.
    """
    from megatron_loop.training.loop import EXIT_NONFINITE, NonFiniteStop, train

    try:
        return train(cfg, resume=getattr(args, "resume", None))
    except NonFiniteStop as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NONFINITE
    finally:
        _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["main"]
