"""tools/gpu_report.sh, the second GPU session (megatron_loop/gpu/second.py: every target the first session
leaves), run end to end on CPU (--smoke): each step (preamble; the shipped Qwen config through the deepspeed launcher as shipped and
with per_loop, no final checkpoint; checkpointing at a given micro-batch, peers, recompute cost, profile,
kept targets) runs at tiny sizes and the one markdown report carries every section with numeric figures
that are the medians of what the runs logged, each beside its device and checkpointing plan. The per_loop
launch is made to fail (a stand-in launcher that fails that run alone): it is reported with its error,
exit code 1, and the benchmarks after it still run -- one smoke run checks both, in the time the old one
took with tools/gpu_first.sh's smoke beside it (the data are prepared in the test process, as the kit
carries them; the data step's commands: tests/integration/tools/test_gpu_first.py). No timing is asserted (GPU figures:
docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_fixtures import make_smoke_data, markdown_table, report_sections
from testpaths import REPO

pytestmark = pytest.mark.slow

ROOT = REPO
TRAINING = "A. Training runs (shipped configs, deepspeed launcher)"


def _report(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1",
                    PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    full_env.update(env)
    return subprocess.run(["bash", "tools/gpu_report.sh", str(out), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


def _tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table of ``text``, in order (each as ``markdown_table`` reads it)."""
    blocks, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(markdown_table("\n".join(current)))
            current = []
    return blocks


def _number(cell: str) -> float:
    return float(cell.split()[0])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_report")
    data = make_smoke_data()
    shim = root / "bin" / "deepspeed"  # the launcher, except for the per_loop run, which it fails
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\ncase \"$*\" in *recompute=per_loop*)\n"
                    f"  echo 'error: simulated launcher failure' >&2; exit 3 ;;\nesac\n"
                    f"exec {Path(sys.executable).parent / 'deepspeed'} \"$@\"\n")
    shim.chmod(0o755)
    out = root / "report"
    result = _report(out, "--smoke", GPU_KIT=str(root / "no-kit"), GPU_REPORT_DATA=str(data),
                     PATH=f"{shim.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 1, (result.stdout[-3000:], result.stderr[-3000:])  # the failed per_loop launch
    return out, (out / "REPORT.md").read_text()


def test_smoke_report_has_every_section_with_numeric_figures(smoke):
    out, text = smoke
    sections = report_sections(text)
    assert {"Targets", "A. Training runs (shipped configs, deepspeed launcher)", "Steps"} <= set(sections)
    for prefix in ("C. ", "D. ", "R. ", "E. ", "F. "):
        assert any(title.startswith(prefix) for title in sections), prefix
    assert not any(title.startswith("B. ") for title in sections)  # the loss bench is tools/gpu_first.sh's
    for field in ("date", "device", "torch", "commit"):
        assert re.search(rf"^\* {field}: \S", text, flags=re.M), field

    device = (out / "logs" / "device.txt").read_text().strip()
    targets = {row["target"]: row for row in markdown_table(sections["Targets"])}
    assert len(targets) == 10
    # each figure measured on CPU is the one the section of its step shows
    runs = {row["run"]: row for row in markdown_table(sections[TRAINING])}
    peers = {row["case"]: row for row in markdown_table(next(v for k, v in sections.items() if k.startswith("C. ")))}
    ckpt = {row["case"]: row for row in markdown_table(next(v for k, v in sections.items() if k.startswith("D. ")))}
    kept, optimizer = ({row["case"]: row for row in table}
                       for table in _tables(next(v for k, v in sections.items() if k.startswith("F. "))))
    shown = {
        "Qwen 4x7 MFU, deepspeed launcher, as shipped": _number(runs["train-qwen"]["MFU %"]),
        "our step / HF transformers (eager: compiled not run)":
            _number(peers["ratio llama 4x5 ours eager / llama 20L HF eager"]["tokens_per_s_ratio"]),
        "step at the paper's micro-batch (auto) / unconstrained step, per token":
            _number(ckpt["llama 4x5 auto"]["time_vs_none"]),
        "host syncs per step (our model step; the loss alone: tools/gpu_first.sh)":
            max(_number(row["host_syncs"]) for row in peers.values() if row["host_syncs"]),
        "Loop / NonLoop tokens/s (Llama 4x5 / 20x1, model step)":
            _number(kept["ratio llama 4x5 / llama 20x1 (model)"]["tokens_per_s_ratio"]),
        "Muon+AdamW step share at global batch 1824 x 2048, 8 ranks":
            100 * _number(optimizer["llama 4x5 muon+adamw"]["fraction_G1824_8ranks"]),
    }
    for name, row in targets.items():
        if name.startswith("graphs recompiled"):  # compile mode: minutes of inductor on CPU
            assert row["measured"] == "not measured" and row["verdict"].startswith("skipped on CPU")
            continue
        if row["step"] == "train-llama":  # the first session's headline
            assert row["measured"] == "not measured" and "tools/gpu_first.sh" in row["verdict"], row
            continue
        assert _number(row["measured"]) == pytest.approx(shown.pop(name), rel=2e-3), row
        assert row["verdict"] == "n/a (CPU smoke)", row
        assert row["device"].startswith(device.split(" (")[0]), row
    assert not shown, shown  # every target measured on CPU was compared
    assert _number(targets["host syncs per step (our model step; the loss alone: tools/gpu_first.sh)"]["measured"]) == 0

    steps = {row["step"]: row for row in markdown_table(sections["Steps"])}
    ran = ("preamble", "data", "train-qwen", "ckpt", "peers", "recompute", "profile", "kept")
    assert all(steps[s]["status"] == "ok" for s in ran), steps
    assert steps["data"]["command"].startswith("`prepared: ")
    assert steps["install"]["status"].startswith("skipped: no kit")
    assert all(steps[s]["status"].startswith("skipped on CPU") for s in ("peers-compiled", "kept-compile"))
    with tarfile.open(out / "artifacts.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"steps.tsv", "logs/train-qwen.log", "runs/train-qwen/metrics.jsonl", "./ckpt.json"} <= names
    assert not any("global_step" in n for n in names)


def test_smoke_training_run_figures_device_plan_and_no_final_checkpoint(smoke):
    """The Qwen run: the shipped config (checkpointing auto) at micro-batch x 2 accumulation, its row the
    medians of metrics.jsonl after the first step (the smoke's warm-up), beside the device and the plan it
    logged; train.save_final=false: no checkpoint written at all."""
    out, text = smoke
    runs = {row["run"]: row for row in markdown_table(report_sections(text)[TRAINING])}
    assert list(runs) == ["train-qwen", "train-qwen-per_loop"]
    row = runs["train-qwen"]
    assert row["what ran"].startswith("checkpointing auto") and "micro-batch 2 x 2 accumulation" in row["what ran"]
    assert row["device"] == (out / "logs" / "device.txt").read_text().strip()
    plan = next(ln for ln in (out / "logs" / "train-qwen.log").read_text().splitlines()
                if ln.startswith("activation recomputation auto over 7 loops"))
    assert plan.startswith(f"activation recomputation {row['checkpointing plan']}")
    records = [json.loads(line) for line in (out / "runs" / "train-qwen" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("event") == "train"]
    assert len(steps) == 3 and row["steps measured (run)"] == "2 (3)"
    for column, key in (("tokens/s", "tokens_per_s"), ("step s", "step_time_s")):
        assert _number(row[column]) == pytest.approx(statistics.median(r[key] for r in steps[1:]), rel=1e-3)
    assert _number(row["MFU %"]) == pytest.approx(100 * statistics.median(r["mfu"] for r in steps[1:]), rel=1e-3)
    assert _number(row["peak GiB"]) == pytest.approx(max(r["mem_peak_gib"] for r in steps), rel=1e-3)
    assert not list((out / "runs" / "train-qwen" / "checkpoints").glob("global_step*"))
    assert not [r for r in records if r.get("event") == "checkpoint"] and records[-1]["checkpoint"] is None


def test_smoke_bench_sections_carry_the_steps_figures(smoke):
    out, text = smoke
    sections = report_sections(text)
    ckpt = {row["case"]: row for row in markdown_table(next(v for k, v in sections.items() if k.startswith("D. ")))}
    assert set(ckpt) == {"llama 4x5 none (micro-batch 1)", "llama 4x5 per_loop", "llama 4x5 selective",
                         "llama 4x5 auto"}
    assert all(_number(row["time_vs_none"]) > 0 and _number(row["peak_step_mib"]) > 0 for row in ckpt.values())
    recompute = {row["case"]: row for row in markdown_table(next(v for k, v in sections.items() if k.startswith("R. ")))}
    assert all(isinstance(_number(recompute[f"llama 4x5 {kind}"]["recompute_cost"]), float)
               for kind in ("selective", "per_loop"))
    profile = markdown_table(next(v for k, v in sections.items() if k.startswith("E. ")))
    assert profile[-1]["case"] == "total (one step)" and _number(profile[-1]["share"]) == 1


def test_smoke_a_failed_run_is_reported_with_its_error_and_the_rest_still_run(smoke):
    out, text = smoke
    sections = report_sections(text)
    steps = {row["step"]: row for row in markdown_table(sections["Steps"])}
    failed = steps["train-qwen-per_loop"]["status"]
    assert failed.startswith("**failed (exit code 3") and "error: simulated launcher failure" in failed
    assert [s for s, row in steps.items() if "failed" in row["status"]] == ["train-qwen-per_loop"]
    assert all(steps[s]["status"] == "ok" for s in ("ckpt", "peers", "recompute", "profile", "kept"))
    runs = {row["run"]: row for row in markdown_table(sections["A. Training runs (shipped configs, deepspeed launcher)"])}
    assert runs["train-qwen-per_loop"]["tokens/s"].startswith("not measured: failed (exit code 3")
    assert runs["train-qwen-per_loop"]["checkpointing plan"] == "not logged"
    pair = markdown_table("| pair |" + sections[TRAINING].split("| pair |", 1)[1])
    assert pair == [{"pair": "qwen", "tokens/s per_loop / as shipped": "not measured",
                     "peak GiB per_loop / as shipped": ""}]


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
