"""A study's report (megatron_loop/studies/report.py) from an archive: the registered outcome first, then the
plan's secondary readings, then any post hoc reading under a heading that says so and without a decision
column; an archive written and read back gives the same report (megatron_loop/studies/archive.py)."""

from __future__ import annotations

from megatron_loop.studies import PLANS, archive, report
from megatron_loop.studies import post_hoc as P
from megatron_loop.studies.plan import Change, Measure
from study_fixtures import synthetic_document, synthetic_study


def test_report_order_and_post_hoc_label(monkeypatch, tmp_path):
    plan = PLANS["finding1_r2"]
    document = synthetic_document(plan, synthetic_study(plan, reasoning_gain=0.0, knowledge_fall=0.3, noise=0.02))
    reading = Change(Measure("compose", "accuracy", split="beyond"), "baseloop_2x4", at="K-1")
    monkeypatch.setitem(P.POST_HOC, plan.name, (("one loop short, beyond", reading, "added for the test"),))
    text = report.markdown(plan, document)
    assert text.startswith("**Registered outcome: not supported.**")
    registered, secondary, post = (text.index(h) for h in (
        "| part of the primary test", "Secondary readings named in the plan", "**Post hoc readings"))
    assert registered < secondary < post
    post_table = text[post:].split("\n\n")[1]
    assert "decision" not in post_table and "verdict" not in post_table and "added for the test" in post_table
    assert "| 20 |" in text  # the per-seed table lists seed 20
    path = archive.write(document, tmp_path / "a.json.gz")
    assert report.markdown(plan, archive.read(path)) == text
