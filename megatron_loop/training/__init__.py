"""Training: the loop, checkpoints through the engine, metrics, signals, distributed setup.

    from megatron_loop import load_config
    from megatron_loop.training import main
    main(load_config("examples/tiny_2x3.yaml"), argparse.Namespace(resume=None))

Modules: ``setup`` (the run built once: checks, process groups, loaders, model, engine, restore),
``loop`` (train steps, validation, NaN and stop policies), ``checkpoint`` (save and restore through
DeepSpeed's engine on every rank, branches and the resume orchestration; the on-disk format is
:mod:`megatron_loop.checkpoint`),
``resume`` (what changed since the checkpoint: applied, converted to another data-parallel size,
or refused), ``lock`` (one run per output folder, one export per export folder), ``metrics``
(JSONL, wandb, tqdm; the tolerant reader of ``metrics.jsonl``), ``curves`` (plots of it), ``signals`` (SIGTERM/SIGUSR1, a vanished
launcher or output folder, wall time), ``distributed`` (this rank's place in the world, the loop's collectives,
launcher watch; the groups themselves are :mod:`megatron_loop.parallel.bootstrap`'s), ``preflight`` (checks before anything is written). docs/RELIABILITY.md has the faults.
"""

from __future__ import annotations


def main(cfg, args) -> int:
    """Entry point behind ``pretrain_loop.py``; returns the exit code.

    Config/data errors propagate as ``LoopConfigError``/``LoopDataError`` (the CLI prints one
    ``error:`` line, exit 2); a stop on non-finite values prints one and returns 3; a collective
    that timed out or lost a peer, or a DataLoader worker that died or hung, prints one and
    returns 1; Ctrl-C (SIGINT) under plain python stops at once without saving (the last
    checkpoint stays published) and returns 130 (under a launcher SIGINT is a stop request:
    training/signals.py).
    """
    # Here, not at the top: the light modules of this package (preflight, lock, metrics) are
    # imported by --dry-run, which must not pay for torch, DeepSpeed and megatron-core.
    from megatron_loop.cli import print_error
    from megatron_loop.training.loop import (EXIT_FAILED, EXIT_NONFINITE, CollectiveFailure, LoaderFailure,
                                             NonFiniteStop, train)

    try:
        return train(cfg, resume=getattr(args, "resume", None))
    except NonFiniteStop as e:
        print_error(str(e))
        return EXIT_NONFINITE
    except (CollectiveFailure, LoaderFailure) as e:
        print_error(str(e))
        return EXIT_FAILED
    except KeyboardInterrupt:
        print_error("interrupted (SIGINT): stopped without saving; the latest published checkpoint is "
                    "unchanged (SIGTERM or SIGUSR1 stop after the step with a checkpoint)")
        return 130
    finally:
        _shutdown()


def _shutdown() -> None:
    from megatron_loop.parallel.bootstrap import shutdown_groups

    shutdown_groups()


__all__ = ["main"]
