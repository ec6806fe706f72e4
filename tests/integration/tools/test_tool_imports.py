"""The tools import the installed package as it is (``pip install -e .``): no ``sys.path`` edit in
``tools/*.py`` but bench.py's, which puts ``tools/`` itself on the path for the ``benchmarks`` package
(not installed) when a test loads bench.py by its path."""

from __future__ import annotations

import re

from testpaths import REPO

ALLOWED = {"bench.py": "tools/ for the benchmarks package (tools/benchmarks/, not installed)"}


def test_no_tool_edits_sys_path_but_the_allowed():
    editing = sorted(p.name for p in (REPO / "tools").glob("*.py")
                     if re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", p.read_text()))
    assert set(editing) <= set(ALLOWED), editing  # an entry may go when its tool stops needing it
