"""The gate before a confirmatory run (megatron_loop/studies/provenance.py, tools/study.py gate): a plan whose
text differs from its registration, an unregistered study and a checkout with uncommitted changes are refused
with one ``error:`` line (exit 2); a clean checkout records its commit and the registration commit."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.studies import PLANS
from megatron_loop.studies import provenance as P
from testpaths import REPO


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git checkout whose registration.py registers finding1_r2's plan in its second commit."""
    plan = PLANS["finding1_r2"]
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "README").write_text("x\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "before")
    reg = tmp_path / P.REGISTRATION_FILE
    reg.parent.mkdir(parents=True)
    reg.write_text(f'REGISTERED = {{"{plan.name}": "{plan.sha256()}"}}\n')
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "register")
    registered_in = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "README").write_text("y\n")
    _git(tmp_path, "commit", "-qam", "after")
    return tmp_path, plan, registered_in


def test_a_clean_checkout_records_its_commit_and_the_registration(repo):
    root, plan, registered_in = repo
    record = P.gate(plan, {plan.name: plan.sha256()}, root)
    assert record["commit"] == _git(root, "rev-parse", "HEAD") != registered_in
    assert record["registration_commit"] == registered_in and record["clean"]
    assert P.is_ancestor(root, registered_in, record["commit"])
    assert record["plan_sha256"] == plan.sha256()


def test_refusals(repo):
    root, plan, _ = repo
    with pytest.raises(LoopConfigError, match="the registered plan .* expected the registered plan unchanged"):
        P.gate(dataclasses.replace(plan, title=plan.title + "!"), {plan.name: plan.sha256()}, root)
    with pytest.raises(LoopConfigError, match="is not registered"):
        P.gate(plan, {}, root)
    (root / "README").write_text("dirty\n")
    with pytest.raises(LoopConfigError, match="uncommitted changes"):
        P.gate(plan, {plan.name: plan.sha256()}, root)
    _git(root, "checkout", "README")
    # a hash registered in the working code but never committed to registration.py: no registration commit
    other = dataclasses.replace(plan, title="another plan")
    with pytest.raises(LoopConfigError, match="no commit of .* adds its hash"):
        P.gate(other, {other.name: other.sha256()}, root)
    assert P.registration_commit(root, other.sha256()) is None


def test_the_command_refuses_a_changed_plan_with_one_error_line(monkeypatch, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("study_tool", REPO / "tools" / "study.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    from megatron_loop import studies

    monkeypatch.setattr(studies, "REGISTERED", {"finding1_r2": "0" * 64})
    assert tool.main(["gate", "finding1_r2", "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: study finding1_r2: the plan's text hashes to")
    assert not (tmp_path / "run").exists()  # nothing written


def test_provenance_file(tmp_path):
    path = P.write_provenance(tmp_path, {"commit": "abc"})
    assert json.loads(path.read_text()) == {"commit": "abc"}
