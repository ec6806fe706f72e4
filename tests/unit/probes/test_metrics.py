"""App. C.4 metrics against hand computations on small tensors (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_loop.probes import metrics
from megatron_loop.probes.positions import EffectivePositions
from megatron_loop.probes.summaries import compare_reports, lag_set_summaries, parse_lag_sets


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_angular_distance_values_and_mean_of_angles():
    u = t([[1, 0], [1, 0], [1, 1], [0, 3]])
    v = t([[0, 1], [-2, 0], [2, 2], [0, 0.5]])
    assert metrics.angular_distance(u, v).tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0], abs=1e-8)
    # A averages individual distances: (0 + 1/2) / 2, not arccos(mean cosine 1/2) / pi = 1/3
    assert metrics.mean_angular_distance(t([[1, 0], [1, 0]]), t([[1, 0], [0, 1]])) == pytest.approx(0.25)


def test_angle_clip_prevents_overshoot():
    u = t([[0.9700530018065531, 0.707819864399788, 0.45938294312745087]])
    raw = float((u * u).sum() / (u.norm() ** 2))
    assert raw > 1.0  # without the clip arccos would give NaN
    assert metrics.angular_distance(u, u).item() == 0.0


def test_angle_epsilon_floor():
    zero, x = t([[0.0, 0.0]]), t([[2.0, 1.0]])
    assert metrics.angular_distance(zero, x).item() == pytest.approx(0.5)  # zero vector -> 1/2
    tiny = t([[1e-7, 0.0]])  # |u||v| = 1e-14 < 1e-12: cosine = 1e-14 / 1e-12 = 0.01
    assert metrics.angular_distance(tiny, tiny).item() == pytest.approx(math.acos(0.01) / math.pi)


def test_relative_update_is_mean_of_ratios_with_floor():
    before, after = t([[3, 4], [1, 0]]), t([[6, 8], [1, 0.5]])
    assert metrics.relative_update(before, after).tolist() == pytest.approx([1.0, 0.5])
    assert metrics.mean_relative_update(before, after) == pytest.approx(0.75)  # not 5.5 / 6
    assert metrics.relative_update(t([[0, 0]]), t([[3, 4]])).item() == pytest.approx(5e12)


def test_state_variance_correction_one_then_token_mean():
    h = t([[1, 2, 3], [0, 0, 6]])  # per-token variances 1 and 24 / 2 = 12
    assert metrics.token_variance(h).tolist() == pytest.approx([1.0, 12.0])
    assert metrics.state_variance(h) == pytest.approx(6.5)
    assert metrics.normalized_variance([1.0, 2.0, 4.0], 2.0) == [0.5, 1.0, 2.0]


def test_amplification_factors_and_telescoping_by_hand():
    x, z, y = [1.0, 2.0, 4.0, 8.0], [1.5, 3.0, 6.0], [3.0, 5.0, 10.0]
    g = metrics.amplification_factors(x, z, y)
    assert g["g_inj"] == pytest.approx([1.5, 1.5, 1.5])
    assert g["g_core"] == pytest.approx([2.0, 5 / 3, 5 / 3])
    assert g["g_mix"] == pytest.approx([2 / 3, 0.8, 0.8])
    assert metrics.telescoping_product(g, train_loops=1) == pytest.approx(8.0 / 2.0)
    assert metrics.telescoping_product(g, train_loops=3) == 1.0  # empty product at L = L_tr
    with pytest.raises(ValueError):
        metrics.telescoping_product(g, train_loops=4)


def test_relative_response_and_floor():
    assert metrics.relative_response(0.3, 0.6) == pytest.approx(0.5)
    assert metrics.relative_response(0.3, 1e-8) == 0.0
    assert metrics.relative_response(0.3, 2e-8) == pytest.approx(1.5e7)
    n, b, c = metrics.interaction_from_updates(t([[3, 4], [0, 0]]), t([[0, 0], [0, 1]]))
    assert (n, b, c) == pytest.approx((3.0, 2.5, 1.2))  # ratio of token means, not mean of ratios


@pytest.mark.parametrize("prelude,coda", [(0, 0), (2, 1)])
@pytest.mark.parametrize("loops", [14, 21])
def test_pair_counts_match_appendix_for_4x7(loops, prelude, coda):
    layout = EffectivePositions(prelude, 4, coda, loops)
    if prelude == 0:  # r(j) = 1 + floor((j - 1) / 4)
        assert layout.loops_of() == [1 + (j - 1) // 4 for j in range(1, 4 * loops + 1)]
    pairs = metrics.lag_pairs(layout.loops_of(), train_loops=7)
    assert list(pairs) == list(range(0, loops - 7))  # lags 0-6 at D=56, 0-13 at D=84
    assert len(pairs[0]) == 6 * (loops - 7)
    for d in range(1, loops - 7):
        assert len(pairs[d]) == 16 * (loops - 7 - d)
    assert all(layout.loop_of(i) > 7 and i < j for members in pairs.values() for i, j in members)


def test_lag_means_summary_and_ratios_by_hand():
    loops_of = [None, 1, 1, 2, 2, 3, 3, None]  # 1 + 2x3 + 1, L_tr = 1: loops 2 and 3 count
    pairs = metrics.lag_pairs(loops_of, train_loops=1)
    assert pairs == {0: [(4, 5), (6, 7)], 1: [(4, 6), (4, 7), (5, 6), (5, 7)]}
    matrix = [[None] * 8 for _ in range(8)]
    for (i, j), v in {(4, 5): 0.1, (6, 7): 0.3, (4, 6): 0.2, (4, 7): 0.4, (5, 6): 0.6, (5, 7): 0.8}.items():
        matrix[i - 1][j - 1] = v
    means = metrics.lag_means(matrix, pairs)
    assert means == pytest.approx({0: 0.2, 1: 0.5})
    assert metrics.lag_summary(means, {0: 2, 1: 4}, [0, 1]) == pytest.approx((0.4 + 2.0) / 6)
    matrix[3][4] = None
    with pytest.raises(ValueError):
        metrics.lag_means(matrix, pairs)
    assert metrics.percent_difference(1.1, 1.0) == pytest.approx(10.0)
    assert metrics.lag_ratio({1: 0.2, 2: 0.4}, {1: 0.4, 2: 0.2, 3: 1.0}) == pytest.approx({1: 0.5, 2: 2.0})


def test_lag_set_summaries_and_comparison():
    assert parse_lag_sets("1-6,2-6,3") == [tuple(range(1, 7)), tuple(range(2, 7)), (3,)]
    by_lag = {"lags": [0, 1, 2], "pairs": [6, 16, 4], "C": [0.9, 0.2, 0.5], "N": [1, 2, 3], "B": [4, 4, 4]}
    s = lag_set_summaries(by_lag, [(1, 2), (1, 2, 3)])
    assert list(s) == ["1-2"]  # lag 3 not measured: that set is left out
    assert s["1-2"]["C"] == pytest.approx((16 * 0.2 + 4 * 0.5) / 20)
    other = dict(by_lag, C=[0.9, 0.1, 1.0], summaries={"1-2": {"C": 0.13, "N": 2.2, "B": 4.0}})
    mine = dict(by_lag, summaries=s)
    wrap = lambda b: {"sampling": {"fingerprint": "x"}, "loops": {"9": {"interaction": {"by_lag": b}}}}  # noqa: E731
    cmp = compare_reports(wrap(mine), wrap(other))["9"]
    assert cmp["ratio_by_lag"]["C"]["ratio"] == pytest.approx([1.0, 2.0, 0.5])
    assert cmp["percent_difference"]["1-2"]["C"] == pytest.approx(100 * (0.26 / 0.13 - 1))
