"""tools/bench.py CLI: --help, tiny CPU runs of its modes producing the tables, and its dispatch to
tools/benchmarks/.

No timing is asserted here; the figures and targets live in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from testpaths import REPO

pytestmark = pytest.mark.slow

ROOT = REPO


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
    """One small CPU run of the peers, train and profile modes: ours vs HF's LlamaForCausalLM (ratio printed),
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
    assert train["params"]["recompute"] == "auto" and train["params"]["micro_batch"] == 1
    assert train["metrics"]["exit_code"] == 0 and train["metrics"]["tokens_per_s"] > 0
    assert "mfu" not in train["metrics"]  # CPU: training logs no MFU without a known peak (logging.peak_tflops)
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


# Modes left to their own tests: a real run of each costs tens of seconds here (DeepSpeed's engine,
# inductor, a corpus and tokenizer), needs a trained export or a launcher's world of two ranks.
# loop-vs-nonloop, train and tp run in this file, exit-decode in tests/integration/eval/test_adaptive_sweep.py, compile and data
# in tools/gpu_report.sh on a GPU.
SPIED_ONLY = ("loop-vs-nonloop", "train", "exit-decode", "compile", "data", "tp")


def test_every_mode_listed_by_help_dispatches_to_its_module(tmp_path, monkeypatch, capsys):
    """Every --mode value of --help is one module of tools/benchmarks/ whose ``run`` main calls once,
    in the order asked; the cheap modes really run at tiny sizes and their rows reach the JSON."""
    import importlib.util

    import torch

    monkeypatch.setattr(sys, "path", list(sys.path))  # bench.py adds tools/ to it
    spec = importlib.util.spec_from_file_location("bench_tool", ROOT / "tools" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as help_exit:
        bench.main(["--help"])
    assert help_exit.value.code == 0
    listed = re.search(r"Modes: (.*?)\. Figures", capsys.readouterr().out).group(1).split(", ")
    assert sorted(listed) == sorted(bench.MODES) and len(listed) == 15

    calls = []

    def spy(mode, real_run):
        def run(setup, args):
            calls.append(mode)
            if mode in SPIED_ONLY:
                return [bench.Row(mode, "spied", {}, {"ran": False})]
            return real_run(setup, args)
        return run

    for mode in listed:
        module = importlib.import_module(f"benchmarks.{bench.MODES[mode]}")
        monkeypatch.setattr(module, "run", spy(mode, module.run))
    import megatron_loop.parallel.bootstrap as bootstrap

    monkeypatch.setattr(bootstrap, "init_world", lambda: calls.append("init_world"))
    out_json = tmp_path / "bench.json"
    threads = torch.get_num_threads()
    try:
        code = bench.main(["--device", "cpu", "--mode", ",".join(listed), "--families", "llama", "--loops", "2",
                           "--steps", "1", "--warmup", "0", "--seq", "16", "--micro-batch", "1", "--accumulation", "1",
                           "--eval-loops", "1,2", "--top", "3", "--hf-model", "unused", "--valid-prefix", "unused",
                           "--sweep-loops", "1,2,3", "--startup-repeats", "1",
                           "--json", str(out_json)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    assert calls == ["init_world", *listed]  # train asks for DeepSpeed's process group before any model
    rows = json.loads(out_json.read_text())["rows"]
    for mode in listed:
        mine = [r for r in rows if r["mode"] == mode]
        assert mine, mode
        if mode not in SPIED_ONLY:
            assert all(r["case"] != "spied" for r in mine)
            assert any(v > 0 for r in mine for v in r["metrics"].values() if isinstance(v, float)), mode
    sweep = {r["case"]: r for r in rows if r["mode"] == "sweep"}
    cost = sweep["cost llama 4x5 r=1..3 one-pass / per-r"]
    assert cost["params"]["loop_forwards_per_r"] == 6 and cost["metrics"]["loop_ratio"] == 0.5
    assert cost["metrics"]["q1"] <= cost["metrics"]["cost_ratio_paired"] <= cost["metrics"]["q3"]
    startup = {r["case"]: r for r in rows if r["mode"] == "eval-startup"}
    assert startup["with a stock task"]["params"]["indexed_tasks"] > 10_000  # lm-eval's catalogue
    assert startup["local tasks only"]["params"]["indexed_tasks"] < 100  # ours and the include folder


@pytest.mark.distributed
def test_tensor_parallel_mode_under_torchrun(tmp_path):
    """--mode tp under torchrun with two CPU ranks (gloo), tiny config: one row per --tp size, each
    rank's tokens/s, and the byte model's TP traffic, none at TP = 1."""
    out_json = tmp_path / "bench_tp.json"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(ROOT / "tools" / "bench.py"), "--device", "cpu", "--mode", "tp",
                          "--config", "examples/tiny_2x3.yaml", "--tp", "1,2", "--seq", "16", "--micro-batch", "1",
                          "--steps", "1", "--warmup", "0", "--json", str(out_json)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["mode"], r["params"]["tp"], r["params"]["world"]) for r in rows] == [("tp", 1, 2), ("tp", 2, 2)]
    assert all(r["metrics"]["tokens_per_s"] > 0 and r["metrics"]["tflops"] > 0 for r in rows)
    assert rows[0]["metrics"]["tp_comm_bytes"] == 0 and rows[1]["metrics"]["tp_comm_bytes"] > 0
    assert rows[0]["metrics"]["throughput_vs_first"] == 1.0
    assert out.stdout.count("| tiny_2x3 tp 2 |") == 1  # one report (rank 0), not one per rank
