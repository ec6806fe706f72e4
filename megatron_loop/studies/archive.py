"""The per-item archive of a confirmatory study: every run's every item at every r, compressed, kept in
the repository (``docs/studies/<study>.json.gz``) so that anyone can re-analyse the study without training.

One gzip'd JSON document: the run's provenance (``studies/provenance.py``: commit, registration commit,
plan hash, start / end, wall time), the items (per task: depth, split, and the compose items' text and gold,
from which the trivial baselines are recomputed) and per run (arm, seed) its outcomes and margins per r and
its held-out loss per r, exactly as ``tools/paired_study.py eval`` wrote them. :func:`load` gives back the
``runs[arm][seed]`` mapping that :func:`~megatron_loop.studies.analysis.analyse` reads (items.json's shape).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from megatron_loop.atomic import write_atomic
from megatron_loop.errors import LoopDataError
from megatron_loop.eval.paired import ITEMS_FILE
from megatron_loop.studies.plan import StudyPlan
from megatron_loop.studies.provenance import PROVENANCE_FILE

ARCHIVE_DIR = Path("docs/studies")
FORMAT = 1
_ITEM_KEYS = ("metric", "group", "n", "chance", "depth", "trained_depths", "split")
WALL_FILE = "wall_s"  # RUN/NAME/wall_s: seconds the run's job took (train, export, sweep), written by the runner


def archive_path(root: Path, study: str) -> Path:
    return root / ARCHIVE_DIR / f"{study}.json.gz"


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; expected the study's run output (bash tools/small_study.sh STUDY)")
    return json.loads(path.read_text())


def collect(plan: StudyPlan, run: Path, corpus_eval: Path) -> dict:
    """The archive document of the study run in ``run``: every arm and seed of the plan must be there, except
    in a smoke run (provenance ``smoke``), whose subset of runs is archived as it is."""
    provenance = _read_json(run / PROVENANCE_FILE)
    runs, items_meta = [], None
    for arm in plan.arms:
        for seed in arm.seeds:
            name = f"{arm.name}-seed{seed}"
            if provenance.get("smoke") and not (run / name / "paired" / ITEMS_FILE).is_file():
                continue
            items = _read_json(run / name / "paired" / ITEMS_FILE)
            meta = {task: {k: v[k] for k in _ITEM_KEYS if k in v} for task, v in items["tasks"].items()}
            if items_meta is None:
                items_meta = meta
            elif meta != items_meta:
                raise LoopDataError(f"{run / name}: its items differ from the other runs'; expected one corpus")
            wall = run / name / WALL_FILE
            runs.append({"arm": arm.name, "seed": seed, "layout": items["layout"], "train_loops": items["train_loops"],
                         "loops": items["loops"], "heldout": {r: v["loss"] for r, v in items["heldout"].items()},
                         "wall_s": float(wall.read_text()) if wall.is_file() else None,
                         "tasks": {t: {"correct": v["correct"], "margin": v["margin"]} for t, v in items["tasks"].items()}})
    compose = corpus_eval / "compose.jsonl"
    if compose.is_file() and items_meta and "compose" in items_meta:
        docs = [json.loads(line) for line in compose.read_text().splitlines() if line.strip()]
        items_meta["compose"]["query"] = [d["query"] for d in docs]
        items_meta["compose"]["answer"] = [d["choices"][d["gold"]] for d in docs]
    return {"format": FORMAT, "study": plan.name, "plan_sha256": plan.sha256(), "provenance": provenance,
            "items": items_meta, "runs": runs}


def write(document: dict, path: Path) -> Path:
    data = gzip.compress(json.dumps(document, separators=(",", ":")).encode(), compresslevel=9, mtime=0)
    write_atomic(path, data)
    return path


def read(path: Path) -> dict:
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; expected a study archive (tools/study.py finish)")
    try:
        document = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError) as e:
        raise LoopDataError(f"{path}: not a gzip'd JSON study archive ({e})") from None
    if document.get("format") != FORMAT:
        raise LoopDataError(f"{path}: archive format {document.get('format')!r}; expected {FORMAT}")
    return document


def runs_of(document: dict) -> dict[str, dict[int, dict]]:
    """``runs[arm][seed]`` in items.json's shape, from an archive document."""
    out: dict[str, dict[int, dict]] = {}
    for run in document["runs"]:
        tasks = {t: {**document["items"][t], **v} for t, v in run["tasks"].items()}
        out.setdefault(run["arm"], {})[int(run["seed"])] = {
            "layout": run["layout"], "train_loops": run["train_loops"], "loops": run["loops"], "tasks": tasks,
            "heldout": {r: {"loss": loss} for r, loss in run["heldout"].items()}}
    return out


def compose_docs(document: dict) -> list[dict]:
    """The compose items (query, gold digit index, depth, split) kept in the archive, for the baselines."""
    meta = document["items"].get("compose", {})
    if "query" not in meta:
        return []
    return [{"query": q, "choices": [str(i) for i in range(10)], "gold": int(a), "depth": d, "split": s}
            for q, a, d, s in zip(meta["query"], meta["answer"], meta["depth"],
                                  meta.get("split") or [None] * len(meta["query"]))]
