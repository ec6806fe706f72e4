"""Compute against accuracy under adaptive exit: ``tools/eval_loops.py
--exit-criterion kl --exit-thresholds ...`` records, per threshold, the mean loops per token,
the effective depth it implies and the scores, next to the fixed-r sweep; threshold 0 reproduces
the fixed r = cap figures exactly and a huge threshold one loop per token."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from data_fixtures import REPO, data_assets
from eval_fixtures import write_local_tasks
from hf_fixtures import hf_assets

pytestmark = pytest.mark.slow

MODEL = "core_qwen_scalar_lg"  # 1+1x3+1, K = 3


def _eval_loops_main():
    spec = importlib.util.spec_from_file_location("eval_loops_tool", REPO / "tools" / "eval_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _args(tmp, *extra):
    local = write_local_tasks(tmp / "tasks")
    return ["--model", str(hf_assets().exports[MODEL]), "--loops", "3", "--tasks", f"proofwriter={local['proofwriter']}",
            "--include-path", str(tmp / "tasks"), "--limit", "6", "--valid-prefix", data_assets().prefix + "_valid",
            "--seq-length", "32", "--valid-sequences", "4", "--batch-size", "4", "--output", str(tmp / "eval"),
            "--no-progress", *extra]


def test_eval_json_has_loops_per_token_per_threshold(tmp_path, monkeypatch):
    from megatron_loop.eval import sweep

    loads = []
    load = sweep.load_hf_model
    monkeypatch.setattr(sweep, "load_hf_model", lambda *a, **k: loads.append(a) or load(*a, **k))
    assert _eval_loops_main()(_args(tmp_path, "--exit-criterion", "kl", "--exit-thresholds", "0,1e9")) == 0
    assert len(loads) == 1  # the fixed-r and the adaptive sweep share one loaded export
    res = json.loads((tmp_path / "eval" / "results.json").read_text())
    adaptive = res["adaptive"]
    assert adaptive["criterion"] == "kl" and adaptive["max_loops"] == 3 and adaptive["thresholds"] == [0, 1e9]
    rows = adaptive["by_threshold"]
    assert list(rows) == ["0", "1e+09"]
    for row in rows.values():
        assert 1.0 <= row["loops_per_token"] <= 3.0 and 1.0 <= row["task_loops_per_token"] <= 3.0
        assert row["effective_depth"] == pytest.approx(1 + row["loops_per_token"] * 1 + 1)
        assert set(row["tasks"]) == {"proofwriter"} and "overall" in row["groups"]
        assert set(row["tasks_stderr"]) == {"proofwriter"}
    # threshold 0 is the fixed model at r = cap = 3, exactly
    assert rows["0"]["loops_per_token"] == rows["0"]["task_loops_per_token"] == 3.0
    assert rows["0"]["heldout"] == res["heldout"]["3"]
    assert rows["0"]["tasks"]["proofwriter"] == res["tasks"]["proofwriter"]["3"]
    # a huge threshold: one loop per token (the Loop Gating grid stays the cap's, so not r = 1 exactly)
    assert rows["1e+09"]["loops_per_token"] == rows["1e+09"]["task_loops_per_token"] == 1.0
    assert rows["1e+09"]["effective_depth"] == 3.0
    table = list(csv.DictReader((tmp_path / "eval" / "adaptive.csv").open()))
    assert [r["mode"] for r in table] == ["kl (r <= 3)"] * 2 + ["fixed"]
    assert (tmp_path / "eval" / "frontier.png").stat().st_size > 0


@pytest.mark.parametrize("extra,message", [
    (["--exit-thresholds", "1e-3"], "--exit-thresholds: expected --exit-criterion kl, cosine or q_exit with it"),
    (["--exit-mode", "freeze"], "--exit-mode: expected --exit-criterion kl, cosine or q_exit with it"),
    (["--exit-criterion", "kl", "--exit-thresholds", "small"], "--exit-thresholds 'small': expected comma-separated"),
    (["--exit-criterion", "cosine"], "--exit-thresholds '': expected comma-separated"),
    (["--exit-criterion", "kl", "--exit-thresholds", "1e-3", "--exit-max-loops", "0"],
     "--exit-max-loops 0: expected an integer >= 1"),
])
def test_bad_exit_arguments_are_one_error_line(tmp_path, capsys, extra, message):
    assert _eval_loops_main()(_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert not (tmp_path / "eval").exists()  # refused before any work


def test_adaptive_exit_on_a_native_export_is_refused_before_any_evaluation(tmp_path, capsys, monkeypatch):
    from megatron_loop.eval import sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("the fixed-r sweep ran"))
    args = ["--model", str(hf_assets().exports["nonloop_llama"]), "--loops", "1", "--tasks", "none",
            "--valid-prefix", data_assets().prefix + "_valid", "--seq-length", "32", "--output", str(tmp_path / "eval"),
            "--no-progress", "--exit-criterion", "kl", "--exit-thresholds", "1e-3"]
    assert _eval_loops_main()(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("error: --exit-criterion kl: a native llama export is NonLoop (one loop); adaptive exit needs a "
                   "LoopLM export")
    assert not (tmp_path / "eval").exists()


def test_bench_backprop_and_exit_decode_modes(tmp_path):
    """tools/bench.py --mode backprop,exit-decode on CPU, tiny: truncation keeps less for backward
    (peak memory is exact on CPU), threshold 0 decodes exactly as fixed r = cap and a huge threshold
    runs one loop per decoded token. No timing is asserted (docs/BENCHMARKS.md has the figures)."""
    import subprocess
    import sys

    out_json = tmp_path / "bench.json"
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench.py"), "--device", "cpu", "--mode", "backprop,exit-decode",
         "--loops", "2", "--steps", "1", "--warmup", "0", "--seq", "16", "--micro-batch", "1",
         "--hf-model", str(hf_assets().exports["base_llama"]), "--valid-prefix", data_assets().prefix + "_valid",
         "--eval-loops", "1,2", "--exits", "kl:0,kl:1e9", "--json", str(out_json)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["case"]: r["metrics"] for r in json.loads(out_json.read_text())["rows"]}
    assert rows["llama 4x2 N=1"]["peak_step_mib"] < rows["llama 4x2 full"]["peak_step_mib"]
    assert rows["llama 4x2 N=2 (K)"]["peak_step_mib"] == rows["llama 4x2 full"]["peak_step_mib"]
    never, always = rows["kl exit 0, r<=2"], rows["kl exit 1e9, r<=2"]
    assert never["loops_per_token"] == 2 and never["same_tokens_as_cap"] == 1.0
    assert always["loops_per_token"] == 1
