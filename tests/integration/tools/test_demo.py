"""`make demo`'s pipeline end to end (README's two commands), shortened: the same tools/demo.sh with
fewer training steps and lm-eval items. Runs every stage through its real CLI: corpus, tokenizer,
preprocessing, DeepSpeed training, HF export, loop sweep with lm-eval, geometry probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testpaths import REPO

pytestmark = pytest.mark.slow

ROOT = REPO


def test_demo_pipeline_end_to_end(tmp_path):
    run = tmp_path / "demo"
    env = dict(os.environ, DEMO_RUN=str(run), DEMO_STEPS="24", DEMO_LIMIT="12",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", "tools/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "Demo finished" in out.stdout
    summary = json.loads((run / "demo_results.json").read_text())
    assert summary["layout"] == "0+2x3+0"
    assert set(summary["heldout_loss"]) == {"1", "2", "3", "4", "5", "6"}
    assert all(0 < v < 10 for v in summary["heldout_loss"].values())
    loops = {"1", "2", "3", "4", "5", "6"}
    # Knowledge (the bundled facts), Reasoning and Overall at every r, each task with its chance level
    for group in ("knowledge", "reasoning", "overall"):
        assert set(summary["groups"][group]) == loops and None not in summary["groups"][group].values()
    assert set(summary["tasks"]) == {"facts", "clutrr", "proofwriter", "bbh"}
    assert summary["chance"] == {"facts": 25.0, "clutrr": 25.0, "proofwriter": 50.0, "bbh": pytest.approx(100 / 3)}
    assert summary["groups_chance"] == {"knowledge": 25.0, "reasoning": pytest.approx((25 + 50 + 100 / 3) / 3),
                                        "overall": pytest.approx((25 + 25 + 50 + 100 / 3) / 4)}
    assert all(0 < se < 50 for se in summary["groups_stderr"]["overall"].values())
    # the held-out loss curve: validation loss at the eval steps of training, at r = 1, K, 2K
    curve = summary["validation_loss_curve"]
    assert len(curve) >= 2 and all(set(row) == {"1", "3", "6"} for row in curve.values())
    assert "Held-out loss (validation split" in out.stdout
    table = out.stdout[out.stdout.index("Knowledge (facts), Reasoning"):]
    assert all(f"| {group} " in table for group in ("knowledge", "reasoning", "overall"))
    names = {Path(p).name for p in summary["plots"]}
    assert {"groups_vs_depth.png", "loss_vs_loops.png", "geometry_trajectory.png"} <= names
    # the checkpoint was written through DeepSpeed and exported
    assert (run / "model" / "train" / "checkpoints" / "latest").is_file()
    assert (run / "model" / "hf" / "config.json").is_file()
    metrics = [json.loads(line) for line in (run / "model" / "train" / "metrics.jsonl").open()]
    assert max(m.get("step", 0) for m in metrics) == 24
