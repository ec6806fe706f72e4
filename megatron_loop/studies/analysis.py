"""The analysis of a registered study (:class:`~megatron_loop.studies.plan.StudyPlan`) from its runs'
per-item results: per seed the plan's changes, over seeds their t intervals, the primary test's decision.

Input: ``runs[arm][seed]`` = one run's items.json (``eval/paired.py``; the archive, ``studies/archive.py``,
holds exactly these). Every number in a study's report comes from :func:`analyse`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megatron_loop.errors import LoopDataError
from megatron_loop.eval.paired import margins, outcomes
from megatron_loop.studies.plan import Change, Measure, StudyPlan, Test, resolve_budget
from megatron_loop.studies.stats import t_interval

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"


def _subset(items: dict, measure: Measure) -> np.ndarray | slice:
    task = items["tasks"][measure.task]
    keep = np.ones(task["n"], dtype=bool)
    if measure.split is not None:
        if "split" not in task:
            raise LoopDataError(f"task {measure.task}: the items have no split; expected a corpus with held-out contexts")
        keep &= np.array(task["split"]) == measure.split
    if measure.depths:
        keep &= np.isin(np.array(task["depth"]), measure.depths)
    if not keep.any():
        raise LoopDataError(f"{measure.label()}: no item")
    return keep


def value(items: dict, measure: Measure, r: int) -> float:
    """The measure of one run at loop count r: percent correct, mean margin (nats) or held-out loss."""
    if measure.kind == "loss":
        return float(items["heldout"][str(r)]["loss"])
    keep = _subset(items, measure)
    if measure.kind == "accuracy":
        return 100.0 * float(outcomes(items, measure.task, r)[keep].mean())
    if measure.kind == "margin":
        return float(margins(items, measure.task, r)[keep].mean())
    raise ValueError(f"measure kind {measure.kind!r}: expected accuracy, margin or loss")


def change_per_seed(plan: StudyPlan, runs: dict[str, dict[int, dict]], change: Change) -> dict[int, float]:
    """{seed: the change} over the seeds every model of it has (a contrast needs both at the seed)."""
    layout = plan.arm(change.arm).toy.layout
    ref, at = resolve_budget(change.ref, layout), resolve_budget(change.at, layout)
    first = {seed: value(items, change.measure, at) - value(items, change.measure, ref)
             for seed, items in runs.get(change.arm, {}).items()}
    if change.minus is None:
        return first
    second = change_per_seed(plan, runs, change.minus)
    return {seed: first[seed] - second[seed] for seed in sorted(set(first) & set(second))}


def decide(test: Test, stat: dict | None) -> str:
    """A part of the primary test: supported / not supported (the effect of interest ruled out) / inconclusive."""
    if stat is None:
        return INCONCLUSIVE
    if test.direction > 0:
        if stat["lower"] > 0:
            return SUPPORTED
        return NOT_SUPPORTED if stat["upper"] < test.sesoi else INCONCLUSIVE
    if stat["upper"] < 0:
        return SUPPORTED
    return NOT_SUPPORTED if stat["lower"] > -test.sesoi else INCONCLUSIVE


def combine(decisions: list[str]) -> str:
    """Every part supported: supported; any part refuted: not supported; otherwise inconclusive."""
    if decisions and all(d == SUPPORTED for d in decisions):
        return SUPPORTED
    if any(d == NOT_SUPPORTED for d in decisions):
        return NOT_SUPPORTED
    return INCONCLUSIVE


def _interval(per_seed: dict[int, float]) -> dict | None:
    if len(per_seed) < 2:
        return None
    out = t_interval(list(per_seed.values()))
    out["per_seed"] = {str(s): v for s, v in sorted(per_seed.items())}
    return out


def spread_per_seed(plan: StudyPlan, runs: dict[str, dict[int, dict]], measure: Measure, arm: str,
                    minus: str | None = None) -> dict[int, float]:
    """{seed: max - min of the measure over every swept r (1..2K for a BaseLoop)} (the spread of scores over
    budgets), or its difference from the model ``minus`` at the same seed."""
    def one(name: str) -> dict[int, float]:
        out = {}
        for seed, items in runs.get(name, {}).items():
            values = [value(items, measure, r) for r in items["loops"]]
            out[seed] = max(values) - min(values)
        return out

    first = one(arm)
    if minus is None:
        return first
    second = one(minus)
    return {s: first[s] - second[s] for s in sorted(set(first) & set(second))}


def curves(plan: StudyPlan, runs: dict[str, dict[int, dict]], measures: dict[str, Measure]) -> dict[str, Any]:
    """Per arm, per measure: mean and standard error over seeds at every swept r (L(r) <= 2 L(K))."""
    out: dict[str, Any] = {}
    for arm in plan.arms:
        seeds = runs.get(arm.name, {})
        if not seeds:
            continue
        entry = {"loops": list(next(iter(seeds.values()))["loops"]), "K": arm.toy.layout[2]}
        for key, measure in measures.items():
            rows = np.array([[value(items, measure, r) for r in entry["loops"]] for items in seeds.values()])
            se = rows.std(axis=0, ddof=1) / np.sqrt(len(rows)) if len(rows) > 1 else np.full(rows.shape[1], np.nan)
            entry[key] = {"mean": rows.mean(axis=0).tolist(), "se": se.tolist()}
        out[arm.name] = entry
    return out


def _reading(plan: StudyPlan, runs: dict[str, dict[int, dict]], reading) -> dict[int, float]:
    if isinstance(reading, Change):
        return change_per_seed(plan, runs, reading)
    return spread_per_seed(plan, runs, reading.measure, reading.arm, reading.minus)  # a Spread


def post_hoc(plan: StudyPlan, runs: dict[str, dict[int, dict]], readings) -> list[dict]:
    """Readings chosen after the data were seen (studies/post_hoc.py): intervals, never a decision."""
    return [{"label": label, "why": why, "what": reading.label(), "stat": _interval(_reading(plan, runs, reading))}
            for label, reading, why in readings]


def analyse(plan: StudyPlan, runs: dict[str, dict[int, dict]], extra: dict[str, Any] | None = None) -> dict:
    """The study's summary: the primary test (per part: per-seed values, t interval, decision; the verdict),
    the secondary readings (t intervals, no decision), which seeds each arm has and which it lacks."""
    missing = [f"{arm.name}-seed{s}" for arm in plan.arms for s in arm.seeds if s not in runs.get(arm.name, {})]
    parts = []
    for test in plan.primary:
        stat = _interval(change_per_seed(plan, runs, test.change))
        parts.append({"name": test.name, "label": test.change.label(), "direction": test.direction,
                      "sesoi": test.sesoi, "stat": stat, "decision": decide(test, stat)})
    secondary = []
    for label, reading in plan.secondary:
        secondary.append({"label": label, "what": reading.label(), "stat": _interval(_reading(plan, runs, reading))})
    return {"study": plan.name, "plan_sha256": plan.sha256(), "verdict": combine([p["decision"] for p in parts]),
            "primary": parts, "secondary": secondary, "missing_runs": missing,
            "seeds": {arm.name: sorted(runs.get(arm.name, {})) for arm in plan.arms}, **(extra or {})}
