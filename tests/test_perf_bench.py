"""tools/bench.py CLI (issue 8): --help and a tiny CPU loop-vs-nonloop run producing the table.

No timing is asserted here; the figures and targets live in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def test_help_lists_the_modes():
    out = _bench("--help")
    assert out.returncode == 0, out.stderr
    for word in ("loop-vs-nonloop", "checkpointing", "optimizer", "data", "eval", "--json", "--device"):
        assert word in out.stdout


def test_loop_vs_nonloop_smoke(tmp_path):
    out_json = tmp_path / "bench.json"
    out = _bench("--device", "cpu", "--mode", "loop-vs-nonloop", "--steps", "2", "--warmup", "0", "--seq", "16",
                 "--micro-batch", "1", "--json", str(out_json))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| llama 4x5 model |" in out.stdout and "| llama 20x1 model |" in out.stdout
    assert "ratio llama 4x5 / llama 20x1 (model)" in out.stdout
    data = json.loads(out_json.read_text())
    assert {"command", "date", "commit", "device"} <= set(data["provenance"])
    rows = {r["case"]: r for r in data["rows"]}
    loop, flat = rows["llama 4x5 full"], rows["llama 20x1 full"]
    assert loop["params"]["effective_depth"] == flat["params"]["effective_depth"] == 20
    for row in (loop, flat):
        assert row["metrics"]["tokens_per_s"] > 0 and row["metrics"]["peak_step_mib"] > 0


def test_unknown_mode_is_an_error():
    out = _bench("--device", "cpu", "--mode", "nonsense")
    assert out.returncode != 0 and "nonsense" in out.stderr


def test_full_steps_through_the_deepspeed_engine():
    out = _bench("--device", "cpu", "--mode", "loop-vs-nonloop", "--engine", "deepspeed", "--steps", "1",
                 "--warmup", "0", "--seq", "16", "--micro-batch", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| llama 4x5 full |" in out.stdout and "| llama 20x1 full |" in out.stdout


def test_peers_train_and_profile_modes(tmp_path):
    """One small CPU run of the three issue-13 modes: ours vs HF's LlamaForCausalLM (ratio printed),
    the real training path on the shipped llama_4x5 config (its checkpointing: auto; metrics.jsonl figures), a profile."""
    out_json = tmp_path / "bench.json"
    out = _bench("--device", "cpu", "--mode", "peers,train,profile", "--families", "llama", "--steps", "1",
                 "--warmup", "0", "--seq", "16", "--micro-batch", "1", "--top", "3", "--json", str(out_json))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["case"]: r for r in json.loads(out_json.read_text())["rows"]}
    ours, hf = rows["llama 4x5 ours eager"], rows["llama 20L HF eager"]
    assert ours["metrics"]["host_syncs"] == 0 and hf["metrics"]["tokens_per_s"] > 0
    assert "ratio llama 4x5 ours eager / llama 20L HF eager" in rows
    train = rows["llama_4x5 (1 steps, median)"]
    assert train["params"]["activation_checkpointing"] == "auto" and train["params"]["micro_batch"] == 1
    assert train["metrics"]["exit_code"] == 0 and train["metrics"]["tokens_per_s"] > 0 and "mfu" in train["metrics"]
    shares = [r["metrics"]["share"] for r in rows.values() if r["mode"] == "profile"]
    assert shares[-1] == 1.0 and 0 < sum(shares[:-1]) <= 1.0


def test_checkpointing_reference_micro_batch_and_recompute_cost(tmp_path):
    """--ac-reference-micro-batch runs the unconstrained `none` case at its own micro-batch and compares
    per token; --mode recompute gives the extra step time per recomputed loop in forwards of that loop."""
    out_json = tmp_path / "bench.json"
    out = _bench("--device", "cpu", "--mode", "checkpointing,recompute", "--families", "llama", "--loops", "3",
                 "--micro-batch", "2", "--ac-reference-micro-batch", "1", "--ac-modes", "none,per_loop",
                 "--steps", "1", "--warmup", "0", "--seq", "16", "--json", str(out_json))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {(r["mode"], r["case"]): r for r in json.loads(out_json.read_text())["rows"]}
    none = rows["checkpointing", "llama 4x3 none (micro-batch 1)"]
    per_loop = rows["checkpointing", "llama 4x3 per_loop"]
    assert none["params"]["micro_batch"] == 1 and per_loop["params"]["micro_batch"] == 2
    assert per_loop["metrics"]["loop_input_mib"] == 2 * none["metrics"]["loop_input_mib"]
    ratio = none["metrics"]["tokens_per_s"] / per_loop["metrics"]["tokens_per_s"]  # per token, not per step
    assert per_loop["metrics"]["time_vs_none"] == ratio and none["metrics"]["time_vs_none"] == 1
    loop = rows["recompute", "llama 4x3 forward, one loop"]["metrics"]
    steps = {kind: rows["recompute", f"llama 4x3 {kind}"]["metrics"] for kind in ("none", "selective", "per_loop")}
    for kind, m in steps.items():
        extra = m["step_s"] - steps["none"]["step_s"]
        assert m["extra_s"] == extra
        assert m["recompute_cost"] == (extra / (2 * loop["step_s"]) if kind != "none" else 0.0)  # K - 1 = 2 loops
        assert m["backward_vs_none"] == (m["step_s"] - loop["forward_s"]) / (steps["none"]["step_s"]
                                                                              - loop["forward_s"])
    bad = _bench("--device", "cpu", "--mode", "recompute", "--loops", "1")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: --mode recompute")
