"""Loop-sweep results: one JSON document and two CSV tables.

``results.json``::

    {"model", "layout", "prelude_layers", "core_layers", "coda_layers", "train_loops",
     "training_depth", "loops": [r...], "effective_depth": {r: L(r)},
     "metrics": {task: metric}, "groups_of": {task: group},
     "tasks": {task: {r: percent}}, "groups": {knowledge|reasoning|overall: {r: percent}},
     "per_depth": {task: {r: {depth: {"accuracy", "n"}}}},
     "heldout": {r: {"loss", "perplexity", "sequences"}}, "limit", "lm_eval_tasks": {task: [...]},
     "subtask_averages": {task: {r: {"mean", "size_weighted", "subtasks": {name: {"accuracy", "n"}}}}} }

``tasks`` holds BBH's ``mean`` (the paper's unweighted mean of the 14 subtasks); ``size_weighted``
is lm-eval's group number (subtasks weighted by their item counts).

``results.csv``: one row per task / group / loss / perplexity, one column per r (header
``r=R (L=...)``), plus a first row with the effective depths. ``per_depth.csv``: long format
``task, depth, r, effective_depth, accuracy, n``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path


def _num_keys(d: dict) -> dict:
    """JSON turns int keys into strings; turn them back (recursively) when reading."""
    out = {}
    for k, v in d.items():
        key = int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k
        out[key] = _num_keys(v) if isinstance(v, dict) else v
    return out


def write_results(results: dict, output: str | Path) -> dict[str, Path]:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "per_depth_csv": out / "per_depth.csv"}
    paths["json"].write_text(json.dumps(results, indent=2))
    loops = results["loops"]
    with paths["csv"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "kind", "metric"] + [f"r={r} (L={results['effective_depth'][r]})" for r in loops])
        w.writerow(["effective_depth", "depth", ""] + [results["effective_depth"][r] for r in loops])
        for task, by_r in results["tasks"].items():
            w.writerow([task, results["groups_of"][task], results["metrics"][task]] + [_fmt(by_r.get(r)) for r in loops])
        for group, by_r in results["groups"].items():
            w.writerow([group, "group", "mean"] + [_fmt(by_r.get(r)) for r in loops])
        if results.get("heldout"):
            for key in ("loss", "perplexity"):
                w.writerow([f"heldout_{key}", "heldout", key] + [_fmt(results["heldout"][r][key]) for r in loops])
    with paths["per_depth_csv"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "depth", "r", "effective_depth", "accuracy", "n"])
        for task, by_r in results.get("per_depth", {}).items():
            for r, strata in by_r.items():
                for depth, cell in strata.items():
                    w.writerow([task, depth, r, results["effective_depth"][r], _fmt(cell["accuracy"]), cell["n"]])
    return paths


def read_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    return _num_keys(json.loads(path.read_text()))


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"
