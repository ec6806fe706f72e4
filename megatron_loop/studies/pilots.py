"""Pilot summaries: what one pilot run (a model trained on a candidate corpus, swept over r = 1..2K) shows,
in a small JSON that is committed whatever it shows (``docs/studies/pilots/``), so that the choices a
registered plan makes (corpus, steps, seed counts) can be traced to the runs that informed them.

Per run: accuracy and mean margin of each task at every r, the compose items per split and depth with the
trivial baselines of the same items (``studies/baselines.py``) and whether the model beats the best of them
at r = K, and the held-out loss per r.
"""

from __future__ import annotations

import numpy as np

from megatron_loop.eval.paired import margins, outcomes
from megatron_loop.studies.baselines import baselines


def _pct(values: np.ndarray) -> float:
    return round(100.0 * float(values.mean()), 2)


def summarise(items: dict, compose_docs: list[dict] | None = None, label: str = "") -> dict:
    """The pilot summary of one run's items.json (``compose_docs``: the corpus's compose items, for the
    baselines)."""
    loops, k = items["loops"], items["train_loops"]
    out: dict = {"label": label or items.get("label"), "layout": items["layout"], "K": k, "loops": loops,
                 "tasks": {}, "heldout_loss": [round(items["heldout"][str(r)]["loss"], 4) for r in loops
                                               if str(r) in items["heldout"]]}
    for task, entry in items["tasks"].items():
        row = {"accuracy": [_pct(outcomes(items, task, r)) for r in loops],
               "margin": [round(float(margins(items, task, r).mean()), 3) for r in loops], "n": entry["n"]}
        if entry.get("split"):
            split, depth = np.array(entry["split"]), np.array(entry["depth"])
            row["by_split_depth"] = {}
            for name in dict.fromkeys(entry["split"]):
                for h in sorted({int(d) for d in depth[split == name]}):
                    keep = (split == name) & (depth == h)
                    row["by_split_depth"][f"{name}/{h}"] = {
                        "n": int(keep.sum()), "accuracy": [_pct(outcomes(items, task, r)[keep]) for r in loops]}
        out["tasks"][task] = row
    if compose_docs and "compose" in out["tasks"]:
        base = baselines(compose_docs)["by_depth"]
        compose = out["tasks"]["compose"]
        compose["baselines"] = {str(h): {k2: (round(v, 2) if isinstance(v, float) else v) for k2, v in b.items()}
                                for h, b in base.items()}
        at_k = loops.index(k)
        compose["beats_best_baseline_at_K"] = {
            key: row["accuracy"][at_k] > base[int(key.split("/")[1])]["best"]
            for key, row in compose.get("by_split_depth", {}).items()}
    return out
