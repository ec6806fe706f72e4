"""``model/placement.py``: a rank's place in the TP x DP grid. Read from megatron-core's groups (one rank at
TP = 1 when none exist, sequence parallelism only above TP = 1); a model built without a placement is one rank."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_loop.config import build_model_config
from megatron_loop.model.placement import ParallelPlacement, current_placement
from megatron_loop.model.vocab import TensorParallelEdges


def test_the_default_placement_is_one_rank_and_frozen():
    placement = ParallelPlacement()
    assert (placement.tp_size, placement.tp_rank, placement.dp_size, placement.dp_rank) == (1, 0, 1, 0)
    assert placement.sequence_parallel is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.tp_size = 2


def test_current_placement_reads_the_groups_and_keeps_sequence_parallelism_for_tp_above_1():
    from megatron_loop.parallel.bootstrap import ensure_groups

    ensure_groups()  # a world of one, TP = 1
    assert current_placement(sequence_parallel=True) == ParallelPlacement(sequence_parallel=False)
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=2))
    assert TensorParallelEdges.of(cfg).placement == ParallelPlacement()  # build_model without a placement
