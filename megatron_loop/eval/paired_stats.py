"""Statistics of the paired loop study (``finding1_paired``): the paper's first finding as the paper
measures it (Sec. 3, Fig. 1(a), Tables 8-9): one trained model, weights fixed, the change of its
scores from r = K to r > K, knowledge items against reasoning items.

:func:`analyse` reads every model and seed of a study with a :class:`PairedPlan`
(``registry/paired.py``) from their ``items.json`` (``eval/paired.py``) and computes, per seed, the
paired item-level changes ``Delta_R(r) = mean_i [c_i(r) - c_i(K)]`` over the reasoning items,
``Delta_K(r)`` over the knowledge items and ``D = Delta_R - Delta_K``; combined over seeds as their
unweighted mean, with 95 % intervals from a hierarchical bootstrap (:func:`hierarchical_bootstrap`:
seeds with replacement, then items with replacement within each drawn seed). Runs outside the
plan's r = K accuracy bands are excluded before any change is computed (:func:`exclusion_reasons`).
The tables and figures are ``eval/paired_report.py``'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.eval.paired import ITEMS_FILE, outcomes
from megatron_loop.eval.tasks import KNOWLEDGE, REASONING, TaskSpec, resolve_tasks

BOOTSTRAP_SEED = 20261127

def _item_mean_draws(values: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` means of ``values`` resampled with replacement (n draws each). Drawn as multinomial
    counts over the distinct values, which is the same distribution as resampling the items and
    far cheaper for item changes in {-1, 0, 1}."""
    distinct, freq = np.unique(values, return_counts=True)
    n = len(values)
    counts = rng.multinomial(n, freq / n, size=count)
    return counts @ distinct.astype(float) / n


def hierarchical_bootstrap(per_seed: list[list[np.ndarray]], n_boot: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Replicates of the seed mean of each statistic, resampling seeds, then items.

    ``per_seed[s][t]`` are the item values of statistic t for seed s (e.g. t = 0: reasoning item
    changes, t = 1: knowledge item changes). Each replicate draws len(per_seed) seeds with
    replacement, shared by every statistic (so a difference of statistics stays paired by seed),
    then, for each drawn seed and statistic independently, that seed's items with replacement, and
    averages the resampled item means over the drawn seeds. Returns ``(n_boot, T)``."""
    if not per_seed:
        raise ValueError("hierarchical_bootstrap: no seeds")
    rng = np.random.default_rng(seed)
    n_seeds, n_stats = len(per_seed), len(per_seed[0])
    drawn = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    out = np.zeros((n_boot, n_stats))
    for t in range(n_stats):
        for s in range(n_seeds):
            rows, slots = np.nonzero(drawn == s)  # every (replicate, slot) that drew seed s
            if len(rows):
                np.add.at(out[:, t], rows, _item_mean_draws(np.asarray(per_seed[s][t]), len(rows), rng))
    return out / n_seeds


def interval(point: float, draws: np.ndarray) -> dict:
    """Point estimate (the plain seed mean), bootstrap 95 % interval (2.5-97.5 %) and the one-sided
    95 % bounds (5 % and 95 %), in percentage points."""
    lo2, lo1, hi1, hi2 = np.percentile(draws, [2.5, 5.0, 95.0, 97.5])
    return {"mean": 100.0 * point, "lo95": 100.0 * lo2, "hi95": 100.0 * hi2,
            "lower_one_sided": 100.0 * lo1, "upper_one_sided": 100.0 * hi1}


def paired_changes(runs: list[dict], tasks: tuple[str, str], r: int, ref: int, n_boot: int,
                   depth: int | None = None, seed: int = BOOTSTRAP_SEED) -> dict | None:
    """Delta_R, Delta_K and D = Delta_R - Delta_K at r against ``ref`` over the runs (seeds) given,
    with their hierarchical-bootstrap intervals; ``depth`` restricts the reasoning items to one hop
    (Delta_R only then). None without runs."""
    if not runs:
        return None
    reasoning, knowledge = tasks
    per_seed, points = [], []
    for items in runs:
        keep = slice(None)
        if depth is not None:
            keep = np.array(items["tasks"][reasoning]["depth"]) == depth
        dr = (outcomes(items, reasoning, r).astype(int) - outcomes(items, reasoning, ref))[keep]
        dk = outcomes(items, knowledge, r).astype(int) - outcomes(items, knowledge, ref)
        per_seed.append([dr, dk])
        points.append((dr.mean(), dk.mean()))
    draws = hierarchical_bootstrap(per_seed, n_boot, seed)
    point_r, point_k = np.mean(points, axis=0)
    out = {"R": interval(point_r, draws[:, 0]), "seeds": len(runs)}
    if depth is None:
        out["K"] = interval(point_k, draws[:, 1])
        out["D"] = interval(point_r - point_k, draws[:, 0] - draws[:, 1])
    return out


def accuracy(items: dict, task: str, r: int, depths: Iterable[int] | None = None) -> float:
    """Percent correct of ``task`` at r, over the items of ``depths`` (every item when None)."""
    values = outcomes(items, task, r)
    if depths is not None:
        values = values[np.isin(np.array(items["tasks"][task]["depth"]), list(depths))]
    return 100.0 * float(values.mean())


def exclusion_reasons(items: dict, plan, k: int) -> list[str]:
    """Why a run is excluded by the plan's r = K rules (empty: included). Reads r = K only: knowledge
    over every item outside ``knowledge_band`` (floor: nothing stored; ceiling: no room to fall);
    reasoning over the trained hops below ``reasoning_floor`` (the task not learned, so its hops beyond
    training say nothing), or over every item (the statistic's items) above ``reasoning_ceiling`` (no
    room to rise)."""
    reasons = []
    know = accuracy(items, plan.knowledge_task, k)
    lo, hi = plan.knowledge_band
    if not lo <= know <= hi:
        reasons.append(f"knowledge at r = K {know:.1f} % outside [{lo:g}, {hi:g}]")
    trained = items["tasks"][plan.reasoning_task]["trained_depths"] or None
    learned = accuracy(items, plan.reasoning_task, k, trained)
    if learned < plan.reasoning_floor:
        reasons.append(f"reasoning (trained hops) at r = K {learned:.1f} % below {plan.reasoning_floor:g}")
    every = accuracy(items, plan.reasoning_task, k)
    if every > plan.reasoning_ceiling:
        reasons.append(f"reasoning (every hop) at r = K {every:.1f} % above {plan.reasoning_ceiling:g}")
    return reasons


def mean_se(values: list[float]) -> dict:
    m = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return {"mean": m, "se": se}




def load_study(study, run: Path, models: list[str] | None = None, seeds: list[int] | None = None,
               available_only: bool = False) -> tuple[dict[str, dict[int, dict]], list[str]]:
    """({twin name: {seed: items.json}}, runs not found) of every twin and seed of ``study`` under
    ``run`` (or of the ``models`` / ``seeds`` given: a smoke test or a partial rerun). A missing
    items.json is an error, unless ``available_only`` (a study cut short): then it is listed."""
    from megatron_loop.registry import toy_copies

    copies = toy_copies(study)
    for wanted, have, what in ((models, {t.name for t, _, _ in copies}, "twin"),
                               (seeds, {s for _, _, s in copies}, "seed")):
        unknown = sorted(set(wanted or ()) - have, key=str)
        if unknown:
            known = ", ".join(map(str, sorted(have)))
            raise LoopConfigError(f"{what} {unknown[0]} is not in study {study.name} ({known})")
    out: dict[str, dict[int, dict]] = {}
    missing = []
    for toy, name, seed in copies:
        if (models and toy.name not in models) or (seeds and seed not in seeds):
            continue
        path = run / name / "paired" / ITEMS_FILE
        if not path.is_file():
            if available_only:
                missing.append(name)
                continue
            raise LoopDataError(f"{path}: missing; run bash tools/small_study.sh {study.name} first")
        out.setdefault(toy.name, {})[seed] = json.loads(path.read_text())
    if not out:
        raise LoopDataError(f"{run}: no items.json of study {study.name}; "
                            f"run bash tools/small_study.sh {study.name} first")
    return {name: dict(sorted(by_seed.items())) for name, by_seed in out.items()}, missing


def analyse_model(seeds: dict[int, dict], plan) -> dict:
    """Everything the plan reports for one allocation: per-seed numbers, exclusions, the paired
    changes at 2K (primary statistic) and K - 1 (control), per hop, curves over r, held-out loss."""
    first = next(iter(seeds.values()))
    k, loops = first["train_loops"], first["loops"]
    reasoning, knowledge = plan.reasoning_task, plan.knowledge_task
    hops = sorted({d for d in first["tasks"][reasoning]["depth"]})
    entry: dict[str, Any] = {"layout": first["layout"], "K": k, "loops": loops,
                             "effective_depth": [first["effective_depth"][str(r)] for r in loops],
                             "trained_hops": first["tasks"][reasoning]["trained_depths"], "hops": hops,
                             "chance": {t: first["tasks"][t]["chance"] for t in (reasoning, knowledge)},
                             "runs": {}}
    target, control = plan.target(k), plan.control(k)
    included = []
    for seed, items in sorted(seeds.items()):
        reasons = exclusion_reasons(items, plan, k)
        run = {"included": not reasons, "excluded_because": reasons,
               "accuracy": {t: [accuracy(items, t, r) for r in loops] for t in (reasoning, knowledge)},
               "per_hop": {str(h): [accuracy(items, reasoning, r, [h]) for r in loops] for h in hops},
               "reasoning_trained_at_K": accuracy(items, reasoning, k, entry["trained_hops"] or None),
               "heldout_loss": [items["heldout"][str(r)]["loss"] for r in loops if str(r) in items["heldout"]]}
        for name, r in (("target", target), ("control", control)):
            dr = outcomes(items, reasoning, r).astype(int) - outcomes(items, reasoning, k)
            dk = outcomes(items, knowledge, r).astype(int) - outcomes(items, knowledge, k)
            run[name] = {"r": r, "R": 100.0 * dr.mean(), "K": 100.0 * dk.mean(),
                         "D": 100.0 * (dr.mean() - dk.mean()),
                         "R_gained": int((dr > 0).sum()), "R_lost": int((dr < 0).sum()),
                         "K_gained": int((dk > 0).sum()), "K_lost": int((dk < 0).sum())}
        entry["runs"][str(seed)] = run
        if not reasons:
            included.append(items)
    entry["seeds_included"] = [int(s) for s, r in entry["runs"].items() if r["included"]]
    tasks = (reasoning, knowledge)
    entry["primary"] = paired_changes(included, tasks, target, k, plan.bootstrap_replicates)
    entry["control"] = paired_changes(included, tasks, control, k, plan.bootstrap_replicates)
    entry["per_hop_target"] = {str(h): paired_changes(included, tasks, target, k, plan.bootstrap_replicates, h)
                               for h in hops}
    entry["curves"] = [paired_changes(included, tasks, r, k, plan.curve_replicates) for r in loops]
    use = [entry["runs"][str(s)] for s in entry["seeds_included"]]
    entry["mean_accuracy"] = {t: [mean_se([u["accuracy"][t][i] for u in use]) if use else None
                                  for i in range(len(loops))] for t in tasks}
    entry["mean_per_hop"] = {str(h): [mean_se([u["per_hop"][str(h)][i] for u in use]) if use else None
                                      for i in range(len(loops))] for h in hops}
    entry["heldout_loss"] = ([mean_se([u["heldout_loss"][i] for u in use]) for i in range(len(loops))]
                             if use and all(len(u["heldout_loss"]) == len(loops) for u in use) else [])
    entry["verdict"] = verdict(entry["primary"], plan)
    return entry


def verdict(stat: dict | None, plan) -> str:
    """The plan's decision rule on one model's primary statistic."""
    if stat is None or stat["seeds"] < plan.min_seeds:
        return "inconclusive"
    supported = stat["R"]["lower_one_sided"] > 0 and stat["K"]["upper_one_sided"] < 0
    return "supported" if supported else "not supported"


def analyse(study, run: Path, models: list[str] | None = None, seeds: list[int] | None = None,
            available_only: bool = False) -> dict:
    """The summary of a paired study (``summary.json``); ``not_run`` lists the runs left out because
    their items.json is missing (``available_only``)."""
    plan = study.paired
    check_tasks((plan.reasoning_task, plan.knowledge_task))
    data, missing = load_study(study, run, models, seeds, available_only)
    order = [t.name for t in study.toys()]
    results = {name: analyse_model(data[name], plan) for name in order if name in data}
    return {"study": study.name, "plan": plan.as_dict(), "primary_model": plan.primary, "models": results,
            "not_run": missing,
            "verdict": results[plan.primary]["verdict"] if plan.primary in results else "inconclusive"}


def check_tasks(plan_tasks: tuple[str, str]) -> list[TaskSpec]:
    """The plan's (reasoning, knowledge) task keys as specs, in the right groups."""
    specs = resolve_tasks(list(plan_tasks))
    if [s.group for s in specs] != [REASONING, KNOWLEDGE]:
        raise LoopConfigError(f"paired tasks {plan_tasks}: expected a reasoning task, then a knowledge task")
    return specs
