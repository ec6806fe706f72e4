"""The committed dependency set (tools/deps.py, requirements-lock.txt): the environment the suite runs
in is exactly the lock, the lock satisfies every range of pyproject.toml, a difference is named
package by package, and the drift check's record keeps one table, newest run first."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from testpaths import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))
import deps  # noqa: E402


def test_the_test_environment_is_exactly_the_lock():
    result = subprocess.run([sys.executable, "tools/deps.py", "check", "--python", sys.executable], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_lock_satisfies_every_requirement_of_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = deps.read_pins(deps.LOCK)
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    for req in requirements:
        name = deps.canonical(req.name)
        assert name in lock, f"{req.name} is not in {deps.LOCK.name}"
        assert req.specifier.contains(lock[name], prereleases=True), (str(req), lock[name])
    assert lock["torch"] == deps.TORCH.split("==")[1]
    assert {"pip", "setuptools", "wheel"} <= set(lock)  # the installers are pinned too


def test_a_difference_is_named_package_by_package(tmp_path, monkeypatch, capsys):
    lock = deps.read_pins(deps.LOCK)
    wrong = dict(lock, transformers="5.23.0")
    del wrong["tqdm"]
    fake = tmp_path / "lock.txt"
    fake.write_text("".join(f"{n}=={v}\n" for n, v in wrong.items()))
    monkeypatch.setattr(deps, "LOCK", fake)
    with pytest.raises(SystemExit) as stop:
        deps.main(["check", "--python", sys.executable])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert f"transformers: lock 5.23.0, environment {lock['transformers']}" in err
    assert f"tqdm: lock absent, environment {lock['tqdm']}" in err


def test_a_malformed_lock_line_is_one_error(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text("numpy==2.4.6\ntransformers>=5\n")
    with pytest.raises(SystemExit):
        deps.read_pins(bad)


def test_drift_record_keeps_one_table_newest_first(tmp_path, monkeypatch):
    doc = tmp_path / "DEPENDENCIES.md"
    doc.write_text(f"# Deps\n\n{deps.RECORD_BEGIN}\n{deps.RECORD_END}\n\nafter\n")
    monkeypatch.setattr(deps, "DOC", doc)
    for day, outcome in (("2026-11-01", "pass: 10 passed"), ("2026-11-26", "FAIL: 1 failed, 9 passed")):
        deps.record({"date": day, "environment": "newest", "differs": "transformers 5.24.0 -> 5.25.0",
                     "outcome": outcome, "command": "make test-latest"})
    text = doc.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| 2026")]
    assert [r.split(" | ")[0] for r in rows] == ["| 2026-11-26", "| 2026-11-01"]
    assert text.count("| date |") == 1 and text.endswith("\n\nafter\n")
