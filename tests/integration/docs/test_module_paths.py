"""Every module path the code and the docs name exists: ``megatron_loop/...py``, ``tools/...``, ``tests/...``,
a package-relative ``model/recompute.py`` (a module of ``megatron_loop/``, or docs/RELIABILITY.md's
``training/test_*.py`` under ``tests/integration/``), and a dotted ``megatron_loop.pkg.module`` whose
package does not hold that module or name. A moved or renamed module leaves no dead path behind
(``model/checkpointing.py`` and ``optim/ds_config.py`` did)."""

from __future__ import annotations

import re
import subprocess

from testpaths import REPO

TEXT = (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt")
# recorded outputs of past device runs quote the paths of their day
RECORDS = ("docs/gpu_runs/",)
# files that name paths that do not exist on purpose
ON_PURPOSE = {"tests/integration/docs/test_module_paths.py": "this test's examples of dead paths",
              "tests/unit/test_import_layers.py": "the package it writes to a temporary folder"}
FULL = re.compile(r"(?<![\w./-])((?:megatron_loop|tools|tests)/[\w/.-]*?\.(?:py|sh))(?![\w/])")
FOLDERS = ("config", "data", "model", "parallel", "measure", "optim", "checkpoint", "training", "export", "hf",
           "eval", "probes", "registry")
RELATIVE = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w/]+\.py)\b")
DOTTED = re.compile(r"(?<![\w.])megatron_loop((?:\.\w+)+)")


def _files() -> list[str]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    return [n for n in names if n.endswith(TEXT) and not n.startswith(RECORDS) and n not in ON_PURPOSE
            and (REPO / n).is_file()]


def _package_names(init) -> set[str]:
    """The names a package's ``__init__.py`` binds or hands on (its imports, definitions, and the strings of
    its module-level assignments: ``__all__``, a table of lazy exports), not the words of its docstring."""
    import ast

    names = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def _placeholder(path: str) -> bool:
    """``tools/x.sh``, ``tools/NAME.py``: a name standing for any file."""
    stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return len(stem) == 1 or stem.isupper()


def _dotted_problem(parts: list[str]) -> str | None:
    """Walk ``megatron_loop.a.b...`` down the tree; the first part that is neither a module nor named in its
    package is the problem (a name after a module is an attribute: not checked)."""
    here = REPO / "megatron_loop"
    for i, part in enumerate(parts):
        if (here / f"{part}.py").is_file():
            return None
        if (here / part / "__init__.py").is_file():
            here = here / part
            continue
        init = here / "__init__.py"
        if init.is_file() and part in _package_names(init):
            return None
        return "megatron_loop." + ".".join(parts[: i + 1])
    return None


def test_every_module_path_in_code_and_docs_exists():
    missing = set()
    for name in _files():
        text = (REPO / name).read_text(errors="ignore")
        for path in FULL.findall(text):
            if not (REPO / path).exists() and not _placeholder(path):
                missing.add(f"{name}: {path}")
        for path in RELATIVE.findall(text):
            if not any((REPO / root / path).exists() for root in ("megatron_loop", "tests/integration", "tests/unit")):
                missing.add(f"{name}: {path}")
        for dotted in DOTTED.findall(text):
            problem = _dotted_problem(dotted.strip(".").split("."))
            if problem:
                missing.add(f"{name}: {problem}")
    assert not missing, "\n".join(sorted(missing))


def test_the_check_sees_each_kind_of_dead_path(tmp_path):
    assert FULL.findall("see megatron_loop/model/checkpointing.py.") == ["megatron_loop/model/checkpointing.py"]
    assert RELATIVE.findall("(``model/apply.py``)") == ["model/apply.py"]
    assert RELATIVE.findall("tests/unit/model/test_looplm.py") == []  # inside a longer path: that path is checked
    assert _dotted_problem(["parallel", "vocab"]) == "megatron_loop.parallel.vocab"
    assert _dotted_problem(["model", "build_model"]) is None  # a name the package hands on
    assert _dotted_problem(["model", "recompute", "RecomputeSettings"]) is None
    assert _placeholder("tools/x.sh") and not _placeholder("tools/bench.py")
