"""tools/gpu_report.sh, the one command that measures every GPU target, run end to end on CPU (--smoke):
each step (corpus, tokenizer, preprocessing, the shipped configs through the deepspeed launcher as shipped
and with per_loop, peers, loss, checkpointing at a given micro-batch, recompute cost, profile, kept targets)
runs at tiny sizes and the one markdown report carries every section with numeric figures that are the
medians of what the runs logged; a failed step is reported with its error and the rest still run.
No timing is asserted (GPU figures: docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
from itertools import dropwhile, takewhile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _report(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1",
                    PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env)
    return subprocess.run(["bash", "tools/gpu_report.sh", str(out), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## ", markdown, flags=re.M)
    return {part.splitlines()[0].strip(): part for part in parts[1:]}


def _table(text: str) -> list[dict[str, str]]:
    """The first markdown table of ``text`` as one dict per row (header -> cell)."""
    lines = list(takewhile(lambda ln: ln.startswith("|"),
                           dropwhile(lambda ln: not ln.startswith("|"), text.splitlines())))
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]
            if not ln.startswith("|---")]


def _number(cell: str) -> float:
    return float(cell.split()[0])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_report") / "report"
    result = _report(out, "--smoke")
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return out, (out / "REPORT.md").read_text()


def test_smoke_report_has_every_section_with_numeric_figures(smoke):
    out, text = smoke
    sections = _sections(text)
    assert {"Targets", "A. Training runs (shipped configs, deepspeed launcher)", "Steps"} <= set(sections)
    for prefix in ("B. ", "C. ", "D. ", "R. ", "E. ", "F. "):
        assert any(title.startswith(prefix) for title in sections), prefix
    for field in ("date", "device", "torch", "commit"):
        assert re.search(rf"^\* {field}: \S", text, flags=re.M), field

    targets = {row["target"]: row for row in _table(sections["Targets"])}
    assert len(targets) == 10
    for name, row in targets.items():
        if name.startswith("graphs recompiled"):  # compile mode: minutes of inductor on CPU
            assert row["measured"] == "not measured" and row["verdict"].startswith("skipped on CPU")
            continue
        assert _number(row["measured"]) >= 0 and row["verdict"] == "n/a (CPU smoke)", row
    assert _number(targets["host syncs per step (loss alone, our model step)"]["measured"]) == 0

    steps = {row["step"]: row for row in _table(sections["Steps"])}
    ran = ("data", "loss", "train-llama", "train-llama-per_loop", "train-qwen", "train-qwen-per_loop", "ckpt",
           "peers", "recompute", "profile", "kept")
    assert all(steps[s]["status"] == "ok" for s in ran), steps
    assert all(steps[s]["status"].startswith("skipped on CPU") for s in ("loss-fused", "peers-compiled",
                                                                        "kept-compile"))
    with tarfile.open(out / "artifacts.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"steps.tsv", "logs/train-llama.log", "runs/train-qwen/metrics.jsonl", "./ckpt.json"} <= names
    assert not any("global_step" in n for n in names)


def test_smoke_training_runs_are_the_shipped_pair_and_their_medians(smoke):
    """Each config ran as shipped (auto) and with per_loop -- two different runs -- and the report's
    figures are the medians of metrics.jsonl after the first step (the smoke's warm-up)."""
    out, text = smoke
    runs = {row["run"]: row for row in _table(_sections(text)["A. Training runs (shipped configs, deepspeed launcher)"])}
    assert set(runs) == {"train-llama", "train-llama-per_loop", "train-qwen", "train-qwen-per_loop"}
    for family in ("llama", "qwen"):
        assert runs[f"train-{family}"]["what ran"].startswith("checkpointing auto")
        assert runs[f"train-{family}-per_loop"]["what ran"].startswith("checkpointing per_loop")
    for run, row in runs.items():
        records = [json.loads(line) for line in (out / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r.get("event") == "train"]
        assert len(steps) == 3 and row["steps measured (run)"] == "2 (3)"
        for column, key in (("tokens/s", "tokens_per_s"), ("step s", "step_time_s")):
            assert _number(row[column]) == pytest.approx(statistics.median(r[key] for r in steps[1:]), rel=1e-3)
        assert _number(row["MFU %"]) == pytest.approx(100 * statistics.median(r["mfu"] for r in steps[1:]), rel=1e-3)
        assert _number(row["peak GiB"]) == pytest.approx(max(r["mem_peak_gib"] for r in steps), rel=1e-3)


def test_smoke_bench_sections_carry_the_steps_figures(smoke):
    out, text = smoke
    sections = _sections(text)
    loss = _table(next(v for k, v in sections.items() if k.startswith("B. ")))
    assert {row["case"] for row in loss} == {"llama head+CE chunked", "qwen head+CE chunked"}
    assert all(row["host_syncs"] == "0" and _number(row["tokens_per_s"]) > 0 for row in loss)
    ckpt = {row["case"]: row for row in _table(next(v for k, v in sections.items() if k.startswith("D. ")))}
    assert set(ckpt) == {"llama 4x5 none (micro-batch 1)", "llama 4x5 per_loop", "llama 4x5 selective",
                         "llama 4x5 auto"}
    assert all(_number(row["time_vs_none"]) > 0 and _number(row["peak_step_mib"]) > 0 for row in ckpt.values())
    recompute = {row["case"]: row for row in _table(next(v for k, v in sections.items() if k.startswith("R. ")))}
    assert all(isinstance(_number(recompute[f"llama 4x5 {kind}"]["recompute_cost"]), float)
               for kind in ("selective", "per_loop"))
    profile = _table(next(v for k, v in sections.items() if k.startswith("E. ")))
    assert profile[-1]["case"] == "total (one step)" and _number(profile[-1]["share"]) == 1


def test_a_failed_step_is_reported_and_the_rest_still_run(tmp_path):
    out = tmp_path / "report"
    result = _report(out, "--smoke", GPU_REPORT_ONLY="data,train-llama,profile", GPU_REPORT_TRAIN_STEPS="0")
    assert result.returncode == 1, (result.stdout[-3000:], result.stderr[-3000:])
    sections = _sections((out / "REPORT.md").read_text())
    steps = {row["step"]: row for row in _table(sections["Steps"])}
    assert "failed (exit code" in steps["train-llama"]["status"] and "max_steps" in steps["train-llama"]["status"]
    assert steps["data"]["status"] == steps["profile"]["status"] == "ok"
    assert steps["peers"]["status"] == "skipped: not in GPU_REPORT_ONLY"
    targets = {row["target"]: row for row in _table(sections["Targets"])}
    llama = targets["Llama 4x5 MFU, deepspeed launcher, as shipped"]
    assert llama["measured"] == "not measured" and "max_steps" in llama["verdict"]
    profile = _table(next(v for k, v in sections.items() if k.startswith("E. ")))
    assert profile[-1]["case"] == "total (one step)"


def test_bad_usage_is_one_error_line(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "REPORT.md").write_text("an earlier report")
    for args in ((str(tmp_path / "old"),), (str(tmp_path / "new"), "--fast")):
        result = subprocess.run(["bash", "tools/gpu_report.sh", *args], cwd=ROOT, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "old" / "REPORT.md").read_text() == "an earlier report"
    assert not (tmp_path / "new").exists()
    result = subprocess.run([sys.executable, "tools/bench_report.py", str(tmp_path / "old")], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "steps.tsv" in result.stderr
