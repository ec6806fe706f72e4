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

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"  # the fixture modules and testpaths
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


def pytest_collection_modifyitems(session, config, items):
    """Files with a ``slow`` test first (each file's tests in their own order; ``-n 2 --dist loadfile``
    hands out whole files in this order): a slow file left for last keeps one worker busy while the
    other has nothing to do, so the suite ends with the many short files instead."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
