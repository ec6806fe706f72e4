"""``probes/summaries.py``: lag sets as written on the command line and the default lag sets of a report
(the pair-weighted summaries and comparisons: tests/unit/probes/test_metrics.py)."""

from __future__ import annotations

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.probes.summaries import default_lag_sets, lag_set_name, parse_lag_sets


def test_parse_and_name_lag_sets():
    assert parse_lag_sets(" 0-2, 4 ,,") == [(0, 1, 2), (4,)]
    assert lag_set_name((2, 3, 4, 5, 6)) == "2-6" and lag_set_name((3,)) == "3-3"
    for text, why in (("2-1", "expected 0 <= a <= b"), ("-1", "expected 'a-b' or 'a' with integers"),
                      ("a-b", "expected 'a-b' or 'a' with integers")):
        with pytest.raises(LoopConfigError) as err:
            parse_lag_sets(text)
        assert str(err.value) == f"lag set {text!r}: {why}"


def _result(max_lag):
    return {"interaction": {"by_lag": {"lags": list(range(max_lag + 1))}}}


def test_default_lag_sets_are_the_common_cross_loop_range():
    # D = 56 and 84 of a 4x7 model: lags up to 6 and 13; the common range is 1..6, then 2..6 (the paper's)
    assert default_lag_sets([_result(6), _result(13)]) == [tuple(range(1, 7)), tuple(range(2, 7))]
    assert default_lag_sets([_result(1)]) == [(1,)]  # 2..1 is empty: only {1}
    assert default_lag_sets([_result(0), {"interaction": None}, {}]) == []  # no cross-loop lag measured
