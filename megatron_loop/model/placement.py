"""Where a model runs: this rank's place in the tensor- and data-parallel grid (:class:`ParallelPlacement`,
what :func:`megatron_loop.model.build_model` is given), read from megatron-core's groups
(:func:`current_placement`), and the group handles the model's tensor-parallel collectives use when they run.

The groups are created in one place, :mod:`megatron_loop.parallel.bootstrap` (which returns the placement);
this module only reads them (TP = 1, DP = 1 when none were built), and building a model reads nothing here
but the placement it is given.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state


@dataclass(frozen=True)
class ParallelPlacement:
    """Where this rank sits: its TP group (size, rank) and its DP group (size, rank)."""

    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    sequence_parallel: bool = False


def current_placement(sequence_parallel: bool = False) -> ParallelPlacement:
    """This rank's placement from megatron-core's groups (TP = 1, DP = 1 when none are built)."""
    if not parallel_state.model_parallel_is_initialized():
        return ParallelPlacement(sequence_parallel=sequence_parallel)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    return ParallelPlacement(
        tp_size=tp, tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        dp_size=parallel_state.get_data_parallel_world_size(), dp_rank=parallel_state.get_data_parallel_rank(),
        sequence_parallel=sequence_parallel and tp > 1)


def tensor_parallel_group():
    return parallel_state.get_tensor_model_parallel_group()


def data_parallel_group():
    return parallel_state.get_data_parallel_group()
