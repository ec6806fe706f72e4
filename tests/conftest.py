"""Test layout (docs/ARCHITECTURE.md, "Tests"):

* ``tests/unit/<package>/test_<module>.py`` tests one module of ``megatron_loop/<package>/`` (top-level
  modules: ``tests/unit/test_<module>.py``);
* ``tests/integration/<theme>/`` holds the end-to-end suites (training runs, reliability faults, the
  multi-rank parallel runs, HF export, evaluation, probes, command-line checks, tools, docs);
* ``tests/support/`` holds the shared fixture modules (``data_fixtures``, ``train_fixtures``, ...), the
  repository's paths (``testpaths.REPO``) and the scripts tests launch by path.

Test modules import the fixture modules by name (``from data_fixtures import data_assets``) from any
depth: this file puts ``tests/support`` on ``sys.path``. Test files are imported with pytest's
``importlib`` mode (``pyproject.toml``), so two folders may hold test files of the same name.

Markers (``pyproject.toml``): ``deps`` (touches a dependency's API), ``slow`` (over ~20 s on a 2-core
machine), ``distributed`` (launches several ranks).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"  # the fixture modules and testpaths
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

# JIT-built extensions go to a folder of this session (the xdist workers and every process the tests
# launch inherit it), never to the user's ~/.cache/torch_extensions: a build killed there (a test's
# timeout, a SIGKILL test) leaves a ``lock`` file that makes every later build in any checkout wait
# forever. Nothing in the suite should build one: DeepSpeed's CPU shared-memory allreduce is skipped
# by parallel/bootstrap.init_world (gloo does the training collectives), and pytest_sessionfinish fails
# the run when a process built it anyway.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="looplm_test_extensions_")


def pytest_collection_modifyitems(session, config, items):
    """Files with a ``slow`` test first (each file's tests in their own order; ``-n 2 --dist loadfile``
    hands out whole files in this order): a slow file left for last keeps one worker busy while the
    other has nothing to do, so the suite ends with the many short files instead."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a process of the suite JIT-built an extension (module comment above)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    folder = Path(os.environ.get("TORCH_EXTENSIONS_DIR", ""))
    if not folder.name.startswith("looplm_test_extensions_") or not folder.is_dir():
        return
    built = sorted(str(p.relative_to(folder)) for p in folder.glob("*/*") if p.is_dir())
    shutil.rmtree(folder, ignore_errors=True)
    if built:
        sys.stderr.write(f"\nerror: the suite JIT-built {built} (expected none: DeepSpeed's CPU shm op is skipped by "
                         f"megatron_loop.parallel.bootstrap.init_world; a process that starts DeepSpeed without it "
                         f"compiles it for minutes, and a build killed mid-way leaves a lock every later build waits on)\n")
        session.exitstatus = 1
