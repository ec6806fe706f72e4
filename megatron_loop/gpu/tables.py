"""What ``tools/bench.py`` and the GPU reports share, without torch (a report is written even when a
step broke): the summary of a run's ``metrics.jsonl`` (:func:`train_summary`), the one renderer of
benchmark rows (:func:`render_rows`, over :func:`markdown_table`: bench.py's printed tables and the
reports' sections are the same markdown) and the provenance helpers (:func:`cpu_name`, :func:`git_commit`)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parents[2]



# metrics.jsonl fields that are counters or settings, not per-step figures
NOT_FIGURES = ("step", "consumed_samples", "tokens", "lr_muon", "lr_adamw", "skipped_updates", "train_loops")


def train_summary(records: Iterable[dict], skip: int) -> dict:
    """Medians of the figures ``metrics.jsonl`` logs for each training step after the first ``skip``
    (compilation, allocator warm-up; all steps if no more are left), the largest ``mem_peak_gib``
    (the peak of the whole run so far), the first and last loss and how many steps were measured."""
    steps = [r for r in records if r.get("event") == "train"]
    if not steps:
        return {}
    measured = steps[skip:] or steps
    keys = [k for k, v in measured[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in NOT_FIGURES]
    out = {k: statistics.median(r[k] for r in measured if isinstance(r.get(k), (int, float))) for k in keys}
    if "mem_peak_gib" in out:
        out["mem_peak_gib"] = max(r["mem_peak_gib"] for r in steps)
    out.update(loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"], steps_measured=len(measured),
               steps_run=len(steps))
    return out


def fmt(value) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[tuple[str, dict]], keys: Sequence[str] | None = None) -> list[str]:
    """``| case | key ... |`` lines: one row per (case, metrics); columns ``keys`` or every metric the
    rows carry (names starting with ``_`` are raw data, left out)."""
    if keys is None:
        keys = list(dict.fromkeys(k for _, m in rows for k in m if not k.startswith("_")))
    out = ["| case | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for case, m in rows:
        out.append(f"| {case} | " + " | ".join(fmt(m.get(k, "")) for k in keys) + " |")
    return out


def render_rows(rows: Sequence[dict], every_heading: bool = True) -> list[str]:
    """Benchmark rows (``mode``, ``case``, ``metrics``: bench.py's ``Row`` as its ``--json`` holds it) as
    one markdown table per mode under ``### MODE`` (with ``every_heading=False`` only when the rows hold
    several modes: a report section of one mode has its own title); ``host_sync_sites`` (where a step
    read the host) is listed under its table instead of a column."""
    out: list[str] = []
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for mode in modes:
        group = [r for r in rows if r["mode"] == mode]
        if every_heading or len(modes) > 1:
            out += [f"### {mode}", ""]
        out += markdown_table([(r["case"], {k: v for k, v in r["metrics"].items() if k != "host_sync_sites"})
                               for r in group]) + [""]
        sites = sorted({s for r in group for s in r["metrics"].get("host_sync_sites", [])})
        if sites:
            out += ["Host sync sites:", "", *[f"* `{s}`" for s in sites[:20]], ""]
    return out


def cpu_name() -> str:
    name = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = ""
    if "torch" in sys.modules:
        threads = f", {sys.modules['torch'].get_num_threads()} torch threads"
    return f"{name} ({os.cpu_count()} cores{threads})"


def git_commit() -> str:
    """Short commit of the repository (+dirty), or GPU_REPORT_COMMIT (for a copy without .git)."""
    if os.environ.get("GPU_REPORT_COMMIT"):
        return os.environ["GPU_REPORT_COMMIT"]

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown (no git repository here; set GPU_REPORT_COMMIT)"
    return head + ("+dirty" if git("status", "--porcelain") else "")
