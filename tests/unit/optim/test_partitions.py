"""``optim/partitions.py``: where each weight's elements sit in a ZeRO flat partition, and the full
weights rebuilt from it. Two data-parallel ranks are laid out in one process: the layout is computed
as rank 0 and as rank 1 of a world of two, and the all-gather hands each the two partitions as
DeepSpeed would hold them. (The layouts read from DeepSpeed's own bookkeeping, on 2 gloo ranks:
tests/integration/parallel/test_zero.py.)"""

from __future__ import annotations

import pytest
import torch

from megatron_loop.optim import partitions
from megatron_loop.optim.partitions import Piece, Slot, ZeroPartition
from megatron_loop.parallel.bootstrap import ensure_groups


def _weights():
    w1 = torch.nn.Parameter(torch.arange(1.0, 7.0).view(2, 3))  # 6 elements
    w2 = torch.nn.Parameter(torch.arange(7.0, 11.0))  # 4
    w3 = torch.nn.Parameter(torch.arange(11.0, 14.0))  # 3
    return [w1, w2, w3]


def _as_rank(monkeypatch, rank, build, locals_by_rank):
    """The layout ``build`` makes on ``rank`` of 2, gathering ``locals_by_rank``."""
    monkeypatch.setattr(partitions, "_rank_world", lambda group: (rank, 2))
    layout = build()
    layout._all_gather = lambda flat: [t.clone() for t in locals_by_rank]
    return layout


def test_contiguous_layout_zero_1_2(monkeypatch):
    """Flat buffer [w1 (0-5) | w2 (6-9) | w3 (10-12) | pad], cut into 2 partitions of 7: w2 straddles the
    boundary; each rank rebuilds the weights that overlap its partition and writes back its own part."""
    weights = _weights()
    flat = torch.cat([w.detach().reshape(-1) for w in weights] + [torch.zeros(1)])
    local = [flat[:7], flat[7:]]

    def build():
        return ZeroPartition.contiguous(weights, [w.shape for w in weights], [0, 6, 10], 7, group=None)

    layout = _as_rank(monkeypatch, 0, build, local)
    assert [s.pieces for s in layout.slots] == [
        (Piece(0, 0, 0, 6),), (Piece(0, 6, 0, 1), Piece(1, 0, 1, 3)), (Piece(1, 3, 0, 3),)]
    for rank, expected_seen, expected_out in (
            (0, ["w1", "w2"], [10., 20., 30., 40., 50., 60., 70.]),
            (1, ["w2", "w3"], [80., 90., 100., 110., 120., 130., 0.])):
        layout = _as_rank(monkeypatch, rank, build, local)
        seen = []

        def times_ten(full, param):
            name = f"w{[p is param for p in weights].index(True) + 1}"
            assert torch.equal(full, param.detach()), name  # the whole weight, in its shape
            seen.append(name)
            return full * 10

        out = layout.map_full(local[rank], times_ten)
        assert seen == expected_seen  # w3 is rank 1's alone, w1 rank 0's: neither computes the other's
        assert out.tolist() == expected_out  # the padding stays zero


def test_striped_layout_zero_3(monkeypatch):
    """Every weight cut into 2 pieces of ceil(numel / 2) (the last zero-padded); a partition is this
    rank's piece of each weight: every rank rebuilds every weight."""
    w1 = torch.nn.Parameter(torch.arange(1.0, 7.0).view(2, 3))
    w2 = torch.nn.Parameter(torch.arange(7.0, 12.0))  # 5 elements: pieces of 3, the second padded
    local = [torch.tensor([1., 2., 3., 7., 8., 9.]), torch.tensor([4., 5., 6., 10., 11., 0.])]

    def build():
        return ZeroPartition.striped([w1, w2], [w1.shape, w2.shape], [3, 3], group=None)

    for rank in (0, 1):
        layout = _as_rank(monkeypatch, rank, build, local)
        assert layout.partition_numel == 6
        assert [s.pieces for s in layout.slots] == [(Piece(0, 0, 0, 3), Piece(1, 0, 3, 3)),
                                                    (Piece(0, 3, 0, 3), Piece(1, 3, 3, 2))]
        shapes = []
        out = layout.map_full(local[rank], lambda full, p: shapes.append(tuple(full.shape)) or -full)
        assert shapes == [(2, 3), (5,)]
        assert torch.equal(out, -local[rank])


def test_a_layout_that_misses_elements_or_a_partition_of_another_size_is_refused():
    w = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"layout covers 5 of 6 elements of a \(2, 3\) weight"):
        ZeroPartition([Slot(w, w.shape, (Piece(0, 0, 0, 5),))], 5, 0, 1, None)
    ensure_groups()  # a real world of one: no gather needed
    layout = ZeroPartition.contiguous([w], [w.shape], [0], 8, group=None)
    assert (layout.rank, layout.world) == (0, 1)
    local = torch.arange(8.0)
    assert layout.map_full(local, lambda full, p: full + 1).tolist() == [1., 2., 3., 4., 5., 6., 0., 0.]
    with pytest.raises(ValueError, match="partition has 7 elements, layout expects 8"):
        layout.map_full(torch.zeros(7), lambda full, p: full)
