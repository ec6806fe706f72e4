"""``megatron_loop/registry/paired.py``: the pre-registered plan of ``finding1_paired`` and the
command that prints it (``tools/paired_study.py plan``)."""

from __future__ import annotations

import subprocess
import sys

from megatron_loop import registry
from testpaths import REPO


def test_the_registered_plan():
    """finding1_paired: three allocations of L(K) = 8, five seeds, 2x4 primary; the plan's text states
    the primary model, statistic, exclusion and decision rules."""
    study = registry.STUDIES["finding1_paired"]
    assert [t.layout for t in study.toys()] == [(0, 1, 8, 0), (0, 2, 4, 0), (0, 4, 2, 0)]
    assert study.seeds == (1, 2, 3, 4, 5) and study.paired.primary == "baseloop_2x4"
    assert study.eval_tasks == "compose,facts" and study.paired.reasoning_task == "compose"
    text = study.paired.text()
    for part in ("Primary model: `baseloop_2x4`", "hierarchical bootstrap", "one-sided", "Exclusion", "Fixed:"):
        assert part in text
    r = subprocess.run([sys.executable, str(REPO / "tools" / "paired_study.py"), "plan", "--study", "finding1_paired"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == text
    r = subprocess.run([sys.executable, str(REPO / "tools" / "paired_study.py"), "plan", "--study", "finding1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "expected a paired study (finding1_paired)" in r.stderr


def test_the_primary_model_runs_first():
    """tools/small_study.sh trains a paired study's primary model's seeds first, then the others seed by
    seed, so a study cut short still has the pre-registered test; other seeded studies stay seed by seed."""
    names = [name for _, name, _ in registry.toy_copies(registry.STUDIES["finding1_paired"])]
    assert names[:7] == [f"baseloop_2x4-seed{s}" for s in range(1, 6)] + ["baseloop_1x8-seed1", "baseloop_4x2-seed1"]
    assert len(names) == len(set(names)) == 15
    assert [name for _, name, _ in registry.toy_copies(registry.STUDIES["finding1"])][:3] == [
        "nonloop_2x1-seed1", "baseloop_2x3-seed1", "nonloop_6x1-seed1"]
