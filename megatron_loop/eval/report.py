"""Loop-sweep results: one JSON document, two CSV tables and the console table.

``results.json``::

    {"model", "layout", "prelude_layers", "core_layers", "coda_layers", "train_loops", "vocab_size",
     "training_depth", "loops": [r...], "effective_depth": {r: L(r)},
     "metrics": {task: metric}, "groups_of": {task: group},
     "tasks": {task: {r: percent}}, "tasks_stderr": {task: {r: percent}},
     "groups": {knowledge|reasoning|overall: {r: percent}}, "groups_stderr": {...},
     "chance": {task: percent}, "groups_chance": {group: percent},
     "per_depth": {task: {r: {depth: {"accuracy", "stderr", "chance", "n"}}}},
     "depth_axes": {task: what its depth counts}, "trained_depths": {task: [depths seen in training]},
     "heldout": {r: {"loss", "stderr", "perplexity", "sequences"}}, "limit", "lm_eval_tasks": {task: [...]},
     "subtask_averages": {task: {r: {"mean", "size_weighted", "subtasks": {name: {"accuracy", "n"}}}}},
     "sweep_passes": [{"mode": "one-pass" | "per-r", "loops": [r...], "reason"}] (one per call),
     "sweep_settings": {...} (what a resumed call must match) }

``tasks`` holds BBH's ``mean`` (the paper's unweighted mean of the 14 subtasks); ``size_weighted``
is lm-eval's group number (subtasks weighted by their item counts).

Standard errors are lm-eval's (closed form for the mean accuracy), propagated through unweighted
means as sqrt(sum se^2) / n; ``null`` where lm-eval has none (a single item).

A sweep writes into ``OUTPUT.partial`` (results.json after each r, then the whole set) and
:func:`publish` swaps that folder in for ``--output`` when it is done.

``results.csv``: one row per task / group / loss / perplexity, each followed by its standard-error
row (metric ``<metric>_stderr``), one column per r (header ``r=R (L=...)``), a last ``chance``
column, plus a first row with the effective depths. ``per_depth.csv``: long format
``task, depth, r, effective_depth, accuracy, stderr, chance, n``.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import math
import os
import shutil
from pathlib import Path

from megatron_loop.atomic import publish_folder, write_atomic
from megatron_loop.cli import check_output_folder, read_tool_json
from megatron_loop.errors import LoopConfigError, LoopDataError

RESULTS_NAME = "results.json"


def _num_keys(d: dict) -> dict:
    """JSON turns int keys into strings; turn them back (recursively) when reading."""
    out = {}
    for k, v in d.items():
        key = int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k
        out[key] = _num_keys(v) if isinstance(v, dict) else v
    return out


def _rows(results: dict):
    """(name, kind, metric, {r: value}, {r: stderr}, chance) for every task, group and held-out row."""
    for task, by_r in results["tasks"].items():
        yield (task, results["groups_of"][task], results["metrics"][task], by_r,
               results.get("tasks_stderr", {}).get(task, {}), results.get("chance", {}).get(task))
    for group, by_r in results["groups"].items():
        yield (group, "group", "mean", by_r, results.get("groups_stderr", {}).get(group, {}),
               results.get("groups_chance", {}).get(group))
    if results.get("heldout"):
        held = results["heldout"]
        yield ("heldout_loss", "heldout", "loss", {r: v["loss"] for r, v in held.items()},
               {r: v.get("stderr") for r, v in held.items()}, None)
        yield ("heldout_perplexity", "heldout", "perplexity", {r: v["perplexity"] for r, v in held.items()}, {}, None)


# What a sweep writes into its --output folder (results.json, the CSV tables, the PNG figures): the set
# it publishes whole, and all a folder it replaces may hold.
OUTPUT_PATTERNS = ("results.json", "*.csv", "*.png")
PARTIAL_SUFFIX = ".partial"


def partial_folder(output: str | Path) -> Path:
    """``OUTPUT.partial`` next to ``--output``: a sweep in progress keeps its results there (results.json
    after each r, then the whole set), and :func:`publish` swaps it in for ``--output`` when the sweep
    is done. A sweep interrupted leaves it, and the same call resumes from it; ``--output`` keeps the
    previous sweep's outputs, whole, until then."""
    out = Path(output)
    return out.with_name(out.name + PARTIAL_SUFFIX)


def _read_results(path: Path, out: Path) -> dict:
    try:
        return _num_keys(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoopDataError(f"--output {out}: {path.name} there is not readable JSON ({' '.join(str(e).split())}); "
                            "pass --overwrite to replace it, or choose another --output") from None


def _matching(previous, fingerprint: dict, out: Path, where: str) -> dict:
    """``previous`` if it was written with ``fingerprint`` (``sweep_settings``), else the one-line refusal."""
    recorded = previous.get("sweep_settings") if isinstance(previous, dict) else None
    if not isinstance(recorded, dict):
        raise LoopConfigError(f"--output {out}: {where} there was written without its sweep settings, so it "
                              "cannot be resumed; pass --overwrite to replace it, or choose another --output")
    wanted = json.loads(json.dumps(fingerprint))
    differs = [k for k in wanted if recorded.get(k) != wanted[k]]
    if differs:
        raise LoopConfigError(f"--output {out}: {where} there holds another sweep (different "
                              f"{', '.join(differs)}); pass --overwrite to replace it, or choose another --output")
    return previous


def check_output(output: str | Path, fingerprint: dict, overwrite: bool = False) -> tuple[dict | None, Path | None]:
    """``--output`` checked before any work: a folder (or one that can be created) that is writable and
    holds nothing but a sweep's outputs (:data:`OUTPUT_PATTERNS`: the sweep replaces it whole).
    Returns the results of an earlier sweep with the same ``fingerprint``
    (:func:`megatron_loop.eval.sweep.sweep_fingerprint`) to resume, and the file they came from: an
    interrupted sweep's (:func:`partial_folder`), else the published ``results.json``. Results of
    another sweep are refused unless ``overwrite`` (which also discards an interrupted sweep's), so a
    finished sweep is never replaced by accident."""
    out = Path(output)
    check_output_folder(out, "--output", "results.json, the CSV tables and the plots")
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise LoopDataError(f"--output {out}: cannot write in {existing}; expected a writable folder")
    partial = partial_folder(out)
    check_output_folder(partial, "--output", "an interrupted sweep's results", given=out)
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir()
                         if not (p.is_file() and any(fnmatch.fnmatch(p.name, g) for g in OUTPUT_PATTERNS)))
        if foreign:
            raise LoopConfigError(f"--output {out}: holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}"
                                  ", which a loop sweep does not write (it replaces the folder whole when it "
                                  "finishes); expected a sweep's folder or a new one: choose another --output")
    if overwrite:
        shutil.rmtree(partial, ignore_errors=True)
        return None, None
    for path, where in ((partial / RESULTS_NAME, f"{partial.name}/{RESULTS_NAME}"), (out / RESULTS_NAME, RESULTS_NAME)):
        if path.is_file():
            return _matching(_read_results(path, out), fingerprint, out, where), path
    return None, None


def publish(output: str | Path) -> Path:
    """Put the finished sweep's outputs (written into :func:`partial_folder`) in place of ``--output``
    as one set: the folder is swapped whole (``atomic.publish_folder``), so a kill at any moment leaves
    the previous set or the new one, never a mix."""
    partial = partial_folder(output)
    for leftover in partial.glob(".*.tmp-*"):  # a write killed half-way (atomic.write_atomic's temporary)
        leftover.unlink()
    return publish_folder(partial, Path(output))


def write_results_json(results: dict, output: str | Path) -> Path:
    """``results.json`` atomically (temp file + rename): after each r of a sweep, so an interrupted
    sweep keeps every finished r."""

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / RESULTS_NAME, json.dumps(results, indent=2))
    return out / RESULTS_NAME


def write_results(results: dict, output: str | Path) -> dict[str, Path]:

    out = Path(output)
    paths = {"json": write_results_json(results, out), "csv": out / "results.csv",
             "per_depth_csv": out / "per_depth.csv"}
    loops = results["loops"]
    with io.StringIO(newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "kind", "metric"] + [f"r={r} (L={results['effective_depth'][r]})" for r in loops]
                   + ["chance"])
        w.writerow(["effective_depth", "depth", ""] + [results["effective_depth"][r] for r in loops] + [""])
        for name, kind, metric, by_r, stderr, chance in _rows(results):
            w.writerow([name, kind, metric] + [_fmt(by_r.get(r)) for r in loops] + [_fmt(chance)])
            if stderr:
                w.writerow([name, kind, f"{metric}_stderr"] + [_fmt(stderr.get(r)) for r in loops] + [""])
        write_atomic(paths["csv"], f.getvalue())
    with io.StringIO(newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "depth", "r", "effective_depth", "accuracy", "stderr", "chance", "n"])
        for task, by_r in results.get("per_depth", {}).items():
            for r, strata in by_r.items():
                for depth, cell in strata.items():
                    w.writerow([task, depth, r, results["effective_depth"][r], _fmt(cell["accuracy"]),
                                _fmt(cell.get("stderr")), _fmt(cell.get("chance")), cell["n"]])
        write_atomic(paths["per_depth_csv"], f.getvalue())
    return paths


def format_table(results: dict) -> str:
    """The task x r table printed at the end of a sweep: Markdown, as lm-eval prints its results
    (same writer, pytablewriter), one ``score ± stderr`` cell per task / group and loop count r."""
    from pytablewriter import MarkdownTableWriter

    loops = results["loops"]
    writer = MarkdownTableWriter()
    writer.headers = ["Task", "Group", "Metric", "Chance"] + [f"r={r} (L={results['effective_depth'][r]})"
                                                             for r in loops]
    writer.value_matrix = [
        [name, kind, metric, format_cell(chance, None)] + [format_cell(by_r.get(r), stderr.get(r)) for r in loops]
        for name, kind, metric, by_r, stderr, chance in _rows(results)
        if any(v is not None for v in by_r.values())]  # not e.g. a group none of the tasks is in
    writer.margin = 1
    return writer.dumps()


def format_differences(results: dict, other: dict, this: str, that: str) -> str:
    """What ``--compare`` prints for another sweep: this sweep's score minus the other's for every
    task, group and held-out loss both measured, at every r both ran, with the standard error of the
    difference taken as sqrt(se1^2 + se2^2) (independent estimates; on the same items the outcomes
    are correlated, so it overstates the paired error) and ``*`` where the difference exceeds two of
    them. ``this`` / ``that``: the two models' names (their figure labels)."""
    from pytablewriter import MarkdownTableWriter

    loops = [r for r in results["loops"] if r in other.get("loops", [])]
    theirs = {(name, kind): (by_r, stderr) for name, kind, _, by_r, stderr, _ in _rows(other)}
    matrix = []
    for name, kind, metric, by_r, stderr, _ in _rows(results):
        if (name, kind) not in theirs or metric == "perplexity":
            continue
        other_r, other_se = theirs[(name, kind)]
        cells = []
        for r in loops:
            a, b = by_r.get(r), other_r.get(r)
            if a is None or b is None:
                cells.append("")
                continue
            se = (math.hypot(stderr[r], other_se[r]) if stderr.get(r) is not None and other_se.get(r) is not None
                  else None)
            cells.append(f"{a - b:+.2f}" + ("" if not se else f" ± {se:.2f}" + (" *" if abs(a - b) > 2 * se else "")))
        if any(cells):
            matrix.append([name, kind, metric] + cells)
    if not matrix:
        return f"differences: {this} and {that} share no task and loop count r"
    writer = MarkdownTableWriter()
    writer.headers = ["Task", "Group", "Metric"] + [f"r={r}" for r in loops]
    writer.value_matrix = matrix
    writer.margin = 1
    return (f"differences: {this} minus {that} (points; loss in nats), ± the standard error of the difference; "
            f"* beyond two standard errors\n{writer.dumps()}")


def read_results(path: str | Path) -> dict:
    """A results.json (or its folder) given to ``--compare``, with one-line errors for a path that is not one."""
    return _num_keys(read_tool_json(path, "--compare", "results.json", "tools/eval_loops.py",
                                    ("loops", "effective_depth", "groups", "training_depth")))


def comparison_mismatches(results: dict, other: dict) -> list[str]:
    """How ``other`` (a ``--compare`` sweep) measured something else than ``results``: other tasks,
    another ``--limit`` or, for a task both ran, another number of items."""
    out = []
    mine, theirs = sorted(results.get("tasks", {})), sorted(other.get("tasks", {}))
    if mine != theirs:
        out.append(f"tasks {','.join(theirs) or 'none'} against {','.join(mine) or 'none'} here")
    if results.get("limit") != other.get("limit"):
        out.append(f"--limit {other.get('limit')} against {results.get('limit')} here")
    n, m = results.get("items", {}), other.get("items", {})
    differ = sorted(k for k in set(n) & set(m) if n[k] != m[k])
    if differ:
        out.append("items " + ", ".join(f"{k} {m[k]} against {n[k]} here" for k in differ))
    return out


def check_comparable(results: dict, others: list[tuple[str, dict]], allow: bool) -> list[str]:
    """Refuse a ``--compare`` sweep that measured something else (its scores would sit beside this
    sweep's as if comparable), unless ``allow`` (``--compare-mismatched``): then one warning line
    each, and the figures' legends give each run's n."""
    problems = [f"--compare {path}: {'; '.join(diff)}" for path, other in others
                if (diff := comparison_mismatches(results, other))]
    if problems and not allow:
        raise LoopConfigError(f"{problems[0]}; expected the same tasks, --limit and items (or --compare-mismatched "
                              "to draw them anyway, each run's n on the legend)")
    return [f"warning: {p}" for p in problems]


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"


def format_cell(value, stderr) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if stderr is None else f"{value:.2f} ± {stderr:.2f}"
