"""``megatron_loop/eval/paired_report.py``: summary.md's tables and the three figures of the paired study."""

from __future__ import annotations

import json

from megatron_loop.eval import paired_report, paired_stats
from megatron_loop.registry.paired import PairedPlan
from paired_fixtures import paired_items


def test_report_tables_and_figures(tmp_path):
    """summary.md quotes every model's primary statistic, per-seed rows and per-hop changes; the three
    figures are written."""
    plan = PairedPlan(primary="b", fixed="test", bootstrap_replicates=500, curve_replicates=100)
    models = {"a": paired_stats.analyse_model({s: paired_items(s, 2, 0.05, -0.05) for s in (1, 2, 3)}, plan),
              "b": paired_stats.analyse_model({s: paired_items(s + 5, 4, 0.05, -0.05) for s in (1, 2, 3)}, plan)}
    summary = {"study": "x", "plan": plan.as_dict(), "primary_model": "b", "models": models,
               "verdict": models["b"]["verdict"]}
    paths = paired_report.write_report(summary, tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert f"Primary model `b`: **{summary['verdict']}**" in text
    assert "| `b` (primary) (0+1x4+0) | 3/3 |" in text and "| `a` | 1 | yes |" in text
    assert "| hop 6 |" in text
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    assert json.loads((tmp_path / "summary.json").read_text())["models"]["a"]["K"] == 2
    post_hoc = dict(summary, plan=plan.post_hoc_all_runs().as_dict())
    assert paired_report.markdown(post_hoc).startswith("**Post hoc, not the registered test:**")
    assert not text.startswith("**Post hoc")
