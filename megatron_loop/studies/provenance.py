"""Where a confirmatory run came from, checked before it starts (``tools/study.py gate``).

A confirmatory run of a registered study starts only from a clean checkout (``git status --porcelain``
empty: the code that runs is a commit) whose plan text hashes to the sha256 recorded for the study in
``megatron_loop/studies/registration.py``; it records that commit (``git rev-parse HEAD``), the
registration commit (the commit that first wrote the plan's hash into registration.py, found with
``git log -S``) and the times, into ``RUN/provenance.json``, which the archive keeps.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from megatron_loop.atomic import write_atomic
from megatron_loop.errors import LoopConfigError
from megatron_loop.studies.plan import StudyPlan

REGISTRATION_FILE = "megatron_loop/studies/registration.py"
PROVENANCE_FILE = "provenance.json"


def git(root: Path, *args: str) -> str:
    """Output of ``git -C root ARGS`` (stripped); LoopConfigError when git fails (not a checkout)."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except OSError as e:
        raise LoopConfigError(f"git {' '.join(args)}: {e}; expected git on PATH") from None
    if done.returncode != 0:
        raise LoopConfigError(f"git {' '.join(args)} in {root}: {done.stderr.strip().splitlines()[-1:]}; "
                              "expected a git checkout of the repository")
    return done.stdout.strip()


def registration_commit(root: Path, sha256: str) -> str | None:
    """The oldest commit whose change to registration.py added ``sha256`` (the plan's registration)."""
    found = git(root, "log", "--format=%H", "-S", sha256, "--", REGISTRATION_FILE).split()
    return found[-1] if found else None


def commit_time(root: Path, commit: str) -> str:
    return git(root, "show", "-s", "--format=%cI", commit)


def is_ancestor(root: Path, older: str, newer: str) -> bool:
    done = subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", older, newer], check=False,
                          capture_output=True)
    return done.returncode == 0


def gate(plan: StudyPlan, registered: dict[str, str], root: Path, allow_dirty: bool = False) -> dict:
    """Refuse a confirmatory run whose plan is not the registered one, or whose checkout has changes;
    return what the run records (commit, registration commit, plan hash, start time)."""
    want = registered.get(plan.name)
    have = plan.sha256()
    if want is None:
        raise LoopConfigError(f"{REGISTRATION_FILE}: study {plan.name} is not registered; expected its plan's "
                              "sha256 committed there before any confirmatory run")
    if have != want:
        raise LoopConfigError(f"study {plan.name}: the plan's text hashes to {have[:12]}, the registered plan "
                              f"({REGISTRATION_FILE}) to {want[:12]}; expected the registered plan unchanged")
    dirty = [line for line in git(root, "status", "--porcelain").splitlines() if line.strip()]
    if dirty and not allow_dirty:
        raise LoopConfigError(f"{root}: uncommitted changes ({len(dirty)} paths, first {dirty[0].strip()!r}); "
                              "expected a clean checkout, so that the run's commit is the code that ran")
    commit = git(root, "rev-parse", "HEAD")
    registered_in = registration_commit(root, want)
    if registered_in is None:
        raise LoopConfigError(f"study {plan.name}: no commit of {REGISTRATION_FILE} adds its hash {want[:12]}; "
                              "expected the registration committed before the run")
    return {"study": plan.name, "plan_sha256": have, "commit": commit, "clean": not dirty,
            "registration_commit": registered_in, "registered_at": commit_time(root, registered_in),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def smoke_record(plan: StudyPlan, root: Path) -> dict:
    """What a smoke run (a pipeline check at toy size, never confirmatory) records: nothing is checked."""
    try:
        commit = git(root, "rev-parse", "HEAD")
    except LoopConfigError:
        commit = None
    return {"study": plan.name, "plan_sha256": plan.sha256(), "commit": commit, "clean": None, "smoke": True,
            "registration_commit": None, "registered_at": None,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_provenance(run: Path, record: dict) -> Path:
    path = run / PROVENANCE_FILE
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return path
