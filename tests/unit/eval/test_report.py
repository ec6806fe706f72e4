"""``eval/report.py``'s comparison check: a ``--compare`` sweep that measured something else (other
tasks, another ``--limit``, another number of items) is refused, or with ``--compare-mismatched``
drawn with a warning naming the difference."""

from __future__ import annotations

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.eval.report import check_comparable, comparison_mismatches

BASE = {"tasks": {"piqa": {}, "clutrr": {}}, "limit": 120, "items": {"piqa": 120, "clutrr": 120}}


def test_same_tasks_limit_and_items_compare_silently():
    assert comparison_mismatches(BASE, dict(BASE)) == []
    assert check_comparable(BASE, [("b.json", dict(BASE))], allow=False) == []


def test_another_limit_or_item_count_is_refused_naming_the_difference():
    small = {**BASE, "limit": 20, "items": {"piqa": 20, "clutrr": 20}}
    assert comparison_mismatches(BASE, small) == ["--limit 20 against 120 here",
                                                  "items clutrr 20 against 120 here, piqa 20 against 120 here"]
    with pytest.raises(LoopConfigError) as err:
        check_comparable(BASE, [("ok.json", dict(BASE)), ("small.json", small)], allow=False)
    assert str(err.value) == ("--compare small.json: --limit 20 against 120 here; items clutrr 20 against 120 here, "
                              "piqa 20 against 120 here; expected the same tasks, --limit and items (or "
                              "--compare-mismatched to draw them anyway, each run's n on the legend)")
    other_tasks = {**BASE, "tasks": {"piqa": {}}, "items": {"piqa": 120}}
    assert comparison_mismatches(BASE, other_tasks) == ["tasks piqa against clutrr,piqa here"]


def test_compare_mismatched_draws_them_with_one_warning_each():
    small = {**BASE, "limit": 20}
    assert check_comparable(BASE, [("small.json", small)], allow=True) == [
        "warning: --compare small.json: --limit 20 against 120 here"]
