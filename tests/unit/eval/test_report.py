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


def test_compare_prints_the_differences_with_their_standard_errors():
    """``--compare`` on the console: this sweep minus the other at every r both ran, ± sqrt(se1^2 + se2^2), * beyond
    two of them; rows and r only one of them has are left out, perplexity too (the loss row says it)."""
    from megatron_loop.eval.report import format_differences

    def sweep(scores, se, loss):
        return {"loops": [1, 3], "tasks": {"clutrr": scores}, "tasks_stderr": {"clutrr": se},
                "groups_of": {"clutrr": "reasoning"}, "metrics": {"clutrr": "acc_norm"}, "groups": {}, "chance": {},
                "heldout": {r: {"loss": v, "stderr": 0.01, "perplexity": 2.0} for r, v in loss.items()}}

    mine = sweep({1: 30.0, 3: 55.0}, {1: 3.0, 3: 4.0}, {1: 2.5, 3: 1.0})
    theirs = {**sweep({1: 28.0, 3: 40.0}, {1: 4.0, 3: 3.0}, {1: 2.0, 3: 1.0}), "loops": [1, 2, 3]}
    text = format_differences(mine, theirs, "a (0+2x3+0)", "b (0+2x3+0)")
    lines = text.splitlines()
    assert lines[0] == ("differences: a (0+2x3+0) minus b (0+2x3+0) (points; loss in nats), ± the standard error of "
                        "the difference; * beyond two standard errors")
    assert [c.strip() for c in lines[1].split("|")[1:-1]] == ["Task", "Group", "Metric", "r=1", "r=3"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[4:-1]] for line in lines[3:]}
    assert cells == {"clutrr": ["+2.00 ± 5.00", "+15.00 ± 5.00 *"], "heldout_loss": ["+0.50 ± 0.01 *", "+0.00 ± 0.01"]}
    assert format_differences(mine, {**theirs, "loops": [2]}, "a", "b") == \
        "differences: a and b share no task and loop count r"
