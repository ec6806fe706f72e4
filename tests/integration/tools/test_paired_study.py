"""The paired study of the paper's first finding (``bash tools/small_study.sh finding1_paired``) as one
command at toy size: corpus, training, export, the item-level sweep r = 1..2K and the analysis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testpaths import REPO

pytestmark = pytest.mark.slow


def test_small_study_command_end_to_end(tmp_path):
    """``bash tools/small_study.sh finding1_paired`` at toy size (a small corpus, 2 training steps, one
    allocation, one seed): the plan is kept with the runs, the twin is trained, exported and swept at
    r = 1..2K on every item, and the analysis writes its summary and figures, whose per-seed numbers are
    those of the raw items file."""
    run = tmp_path / "study"
    env = dict(os.environ, STUDY_RUN=str(run), STUDY_STEPS="2", STUDY_ONLY_MODELS="baseloop_4x2",
               STUDY_ONLY_SEEDS="1", STUDY_CORPUS_EXTRA="--reasoning-docs-per-task 300 --knowledge-people 12 "
               "--knowledge-mentions 4 --eval-items-per-depth 3", OMP_NUM_THREADS="1",
               WANDB_MODE="disabled", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", str(REPO / "tools" / "small_study.sh"), "finding1_paired"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plan = (run / "plan.txt").read_text()
    assert plan.startswith("# tools/paired_study.py plan --study finding1_paired, ")
    assert "Primary model: `baseloop_2x4`" in plan
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["models"]) == ["baseloop_4x2"] and summary["verdict"] == "inconclusive"  # no primary run
    items = json.loads((run / "baseloop_4x2-seed1" / "paired" / "items.json").read_text())
    assert items["loops"] == [1, 2, 3, 4] and items["train_loops"] == 2 and items["layout"] == "0+4x2+0"
    assert items["tasks"]["compose"]["n"] == 18 and items["tasks"]["facts"]["n"] == 36  # depth 1: 3 of 30 contexts
    assert items["tasks"]["compose"]["trained_depths"] == [1, 2, 3, 4]
    assert set(items["heldout"]) == {"1", "2", "3", "4"}
    row = summary["models"]["baseloop_4x2"]["runs"]["1"]
    outcome = lambda task, r: np.array([int(c) for c in items["tasks"][task]["correct"][str(r)]])  # noqa: E731
    assert row["target"]["R"] == pytest.approx(100 * (outcome("compose", 4).mean() - outcome("compose", 2).mean()))
    assert row["target"]["K"] == pytest.approx(100 * (outcome("facts", 4).mean() - outcome("facts", 2).mean()))
    assert row["accuracy"]["facts"][1] == pytest.approx(100 * outcome("facts", 2).mean())
    for figure in ("paired_changes_vs_r.png", "paired_per_hop.png", "paired_primary.png"):
        assert (run / figure).stat().st_size > 10_000
    assert "Primary model `baseloop_2x4`: **inconclusive**" in (run / "summary.md").read_text()
