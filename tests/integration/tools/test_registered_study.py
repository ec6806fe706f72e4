"""A registered study's one command (``bash tools/small_study.sh finding2``) as a smoke run at toy size
(STUDY_SMOKE=1: a pipeline check, nothing gated, the archive kept in the run folder): corpus, one model (the
Coda CoreLoop, swept to r = 15) trained, exported and swept on every item at every r, the archive written and
analysed by the plan; and the
small fixes of issue 42 item 6 (--help, --list counts runs x seeds)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testpaths import REPO


def _env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled",
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra)


def test_help_and_list():
    done = subprocess.run(["bash", str(REPO / "tools" / "small_study.sh"), "--help"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "bash tools/small_study.sh finding1_r2" in done.stdout and not done.stderr
    done = subprocess.run(["bash", str(REPO / "tools" / "small_study.sh"), "--list"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    rows = {line.split("\t")[0]: line.split("\t")[3] for line in done.stdout.splitlines()}
    assert rows["finding1_paired"] == "3 paper runs; on CPU 3 models x 5 seeds = 15 runs"
    assert rows["finding1"] == "2 paper runs; on CPU 3 models x 3 seeds = 9 runs"
    assert rows["finding2"] == "3 paper runs; on CPU 3 models = 24 runs"  # seeds per model: 10, 10, 4
    assert rows["table2"] == "22 paper runs (a parameter table: nothing to train)"


@pytest.mark.slow
def test_registered_study_smoke_run(tmp_path):
    run = tmp_path / "study"
    env = _env(STUDY_RUN=str(run), STUDY_STEPS="2", STUDY_ONLY_SEEDS="1", STUDY_SMOKE="1",
               STUDY_ONLY_MODELS="coreloop_0+1x7+1",
               STUDY_CORPUS_EXTRA="--reasoning-docs-per-task 300 --knowledge-people 12 --knowledge-mentions 2 "
                                  "--eval-items-per-depth 3 --held-out-contexts 4 --control-docs 20 --control-items 8")
    done = subprocess.run(["bash", str(REPO / "tools" / "small_study.sh"), "finding2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["smoke"] and prov["finished_utc"] and prov["wall_s"] >= 0
    document = json.loads(gzip.decompress((run / "finding2.json.gz").read_bytes()))
    assert [(r["arm"], r["seed"]) for r in document["runs"]] == [("coreloop_0+1x7+1", 1)]  # the subset asked for
    core = next(r for r in document["runs"] if r["arm"] == "coreloop_0+1x7+1")
    assert core["loops"] == list(range(1, 16)) and set(core["tasks"]) == {"compose", "facts", "openbook"}
    assert all(len(m) == document["items"]["facts"]["n"] for m in core["tasks"]["facts"]["margin"].values())
    assert core["wall_s"] > 0
    items = json.loads((run / "coreloop_0+1x7+1-seed1" / "paired" / "items.json").read_text())
    assert items["tasks"]["compose"]["correct"] == core["tasks"]["compose"]["correct"]  # archived as written
    assert "smoke run" in done.stdout and "Registered outcome: inconclusive" in done.stdout  # one seed: no interval
