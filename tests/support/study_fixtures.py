"""Synthetic per-item results of the registered studies (items.json's shape, ``eval/paired.py``) with planted
changes, for the analysis, archive and report tests (``megatron_loop/studies/``)."""

from __future__ import annotations

import numpy as np

from megatron_loop.registry import sweep_loops

SPLITS = ["seen"] * 50 + ["in_horizon"] * 300 + ["beyond"] * 400
DEPTHS = [1] * 50 + [2 + i % 3 for i in range(300)] + [5 + i % 2 for i in range(400)]


def synthetic_run(layout: tuple[int, int, int, int], seed: int, reasoning_gain: float = 0.0,
                  knowledge_fall: float = 0.0, noise: float = 0.0) -> dict:
    """One run: reasoning items (in_horizon) whose outcome at r = 2K moves by ``reasoning_gain`` (a share of
    the items; plus ``noise`` * a seed-level normal draw), knowledge margins that fall by ``knowledge_fall``
    nats at 2K (linearly from K), everything else unchanged from K."""
    p, s, k, c = layout
    rng = np.random.default_rng(seed)
    loops = sweep_loops(layout, 2)  # tools/small_study.sh's sweep: every r with L(r) <= 2 L(K)
    shift = reasoning_gain + noise * rng.standard_normal()
    base_r = (rng.random(len(SPLITS)) < 0.5).astype(int)
    base_k = rng.normal(0.5, 1.0, size=600)
    base_b = rng.normal(0.2, 1.0, size=300)
    correct_r, margin_r, margin_k, correct_k, margin_b, correct_b, heldout = {}, {}, {}, {}, {}, {}, {}
    for r in loops:
        frac = max(0.0, (r - k) / k)
        c_r = base_r.copy()
        flip = rng.random(len(SPLITS)) < abs(shift) * frac
        target = np.array([x == "in_horizon" for x in SPLITS]) & flip
        c_r[target] = 1 if shift > 0 else 0
        m_k = base_k - knowledge_fall * frac - (0.5 * (k - r) / k if r < k else 0.0)
        correct_r[str(r)] = "".join(map(str, c_r))
        margin_r[str(r)] = [round(1000 * (0.5 if x else -0.5)) for x in c_r]
        margin_k[str(r)] = [round(1000 * m) for m in m_k]
        correct_k[str(r)] = "".join("1" if m > 0 else "0" for m in m_k)
        margin_b[str(r)] = [round(1000 * m) for m in base_b]
        correct_b[str(r)] = "".join("1" if m > 0 else "0" for m in base_b)
        heldout[str(r)] = {"loss": 1.0 + 0.01 * abs(r - k)}
    task = lambda n, correct, margin, **kw: {"n": n, "correct": correct, "margin": margin, "metric": "acc",  # noqa: E731
                                             "group": "x", "chance": 10.0, "trained_depths": [], **kw}
    return {"layout": f"{p}+{s}x{k}+{c}", "train_loops": k, "loops": loops, "heldout": heldout,
            "tasks": {"compose": task(len(SPLITS), correct_r, margin_r, depth=list(DEPTHS), split=list(SPLITS)),
                      "facts": task(600, correct_k, margin_k, depth=None),
                      "openbook": task(300, correct_b, margin_b, depth=None)}}


def synthetic_study(plan, **effects) -> dict[str, dict[int, dict]]:
    """runs[arm][seed] for every arm and seed of ``plan``, with the same planted effects."""
    return {arm.name: {seed: synthetic_run(arm.toy.layout, 1000 * i + seed, **effects) for seed in arm.seeds}
            for i, arm in enumerate(plan.arms)}


def synthetic_document(plan, runs: dict[str, dict[int, dict]], smoke: bool = True) -> dict:
    """An archive document (``studies/archive.py``'s format) of synthetic runs."""
    first = next(iter(next(iter(runs.values())).values()))
    keys = ("metric", "group", "n", "chance", "depth", "trained_depths", "split")
    items = {t: {k: v[k] for k in keys if k in v} for t, v in first["tasks"].items()}
    return {"format": 1, "study": plan.name, "plan_sha256": plan.sha256(), "items": items,
            "provenance": {"smoke": smoke, "commit": "0" * 40, "plan_sha256": plan.sha256(), "started_utc": "t0",
                           "finished_utc": "t1", "wall_s": 5400, "registration_commit": None, "registered_at": None},
            "runs": [{"arm": arm, "seed": seed, "layout": r["layout"], "train_loops": r["train_loops"],
                      "loops": r["loops"], "heldout": {k: v["loss"] for k, v in r["heldout"].items()}, "wall_s": 600.0,
                      "tasks": {t: {"correct": v["correct"], "margin": v["margin"]} for t, v in r["tasks"].items()}}
                     for arm, by_seed in runs.items() for seed, r in by_seed.items()]}
