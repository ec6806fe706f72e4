"""Where things are, for every test, fixture module and script under ``tests/``: the repository root
(``REPO``) and the folders of the scripts the tests launch by path. The one place that computes them
from this file's location; ``tests/conftest.py`` puts this folder on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent

DIST_SCRIPTS = SUPPORT / "dist_scripts"    # one rank of a multi-rank test (gloo)
PERF_SCRIPTS = SUPPORT / "perf_scripts"    # DeepSpeed-engine / Triton-interpreter checks in a fresh process
HF_SCRIPTS = SUPPORT / "hf_scripts"        # HF export checks in a fresh process
TRAIN_SCRIPTS = SUPPORT / "train_scripts"  # pretrain_loop.py wrapped with injected faults or recorders



def load_script(path: str, module_name: str | None = None):
    """A script of the repository (``tools/NAME.py``, ``pretrain_loop.py``) as a module: the scripts
    are not on ``sys.path`` under pytest."""
    import importlib.util

    file = REPO / path
    spec = importlib.util.spec_from_file_location(module_name or file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
