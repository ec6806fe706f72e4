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
                          capture_output=True, text=True, timeout=120)


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
