"""``probes/positions.py``: effective positions l = 1..D of a looped layout a + s x L + b (App. C.4), exact for
a CoreLoop (the lag pairs built on them: tests/unit/probes/test_metrics.py)."""

from __future__ import annotations

import pytest

from megatron_loop.probes.positions import EffectivePositions


def test_segments_and_loops_of_a_coreloop():
    layout = EffectivePositions(prelude=1, shared=2, coda=2, num_loops=3)  # 1 + 2 x 3 + 2 = 9
    assert layout.depth == 9
    assert layout.segments() == ["prelude"] + ["core"] * 6 + ["coda"] * 2
    assert layout.loops_of() == [None, 1, 1, 2, 2, 3, 3, None, None]


def test_first_and_last_shared_block_of_each_loop():
    layout = EffectivePositions(prelude=1, shared=2, coda=2, num_loops=3)
    assert [layout.first_shared(t) for t in range(3)] == [2, 4, 6]  # input z^(t)
    assert [layout.last_shared(t) for t in range(3)] == [3, 5, 7]  # output y^(t)
    assert all(layout.loop_of(layout.first_shared(t)) == t + 1 == layout.loop_of(layout.last_shared(t))
               for t in range(3))


def test_a_baseloop_has_only_core_positions():
    layout = EffectivePositions(prelude=0, shared=4, coda=0, num_loops=2)
    assert layout.segments() == ["core"] * 8 and layout.loops_of() == [1] * 4 + [2] * 4


@pytest.mark.parametrize("position", [0, 10])
def test_positions_outside_the_depth_are_refused(position):
    with pytest.raises(ValueError) as err:
        EffectivePositions(prelude=1, shared=2, coda=2, num_loops=3).segment(position)
    assert str(err.value) == f"effective position {position} outside 1..9"
