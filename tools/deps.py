#!/usr/bin/env python3
"""The project's dependency set: one committed lock, and a check that sees upstream drift first.

    python3 tools/deps.py lock                  # re-resolve inside pyproject's ranges -> requirements-lock.txt
    python3 tools/deps.py check [--python PY]   # the environment equals the lock (make runs it after installing)
    python3 tools/deps.py drift [--pin SPEC ...] [--record]
                                                # a second environment at the newest versions pyproject allows
                                                # (or with SPEC pinned, e.g. transformers==5.23.0), the tests
                                                # marked ``deps`` run in it, the result recorded in the docs

``requirements-lock.txt`` holds every distribution ``make`` installs (``pip freeze --all``: pip,
setuptools and wheel too) at one exact version. ``make`` installs with it as pip's constraint
(``PIP_CONSTRAINT``, so that the build environments of source distributions, e.g. DeepSpeed's, are
held to it as well) and then runs ``check``: a fresh clone next month builds the environment CI
tested, or stops saying which package differs. ``pyproject.toml`` keeps version ranges for users
who install the package into their own environment; ``lock`` resolves the newest versions inside
them in a new virtual environment (no pip cache) and rewrites the file; ``drift`` does the same
resolution without writing the lock and runs the tests that touch each dependency's API
(``pytest -m deps``: the HF export, generation and lm-eval, DeepSpeed's engine and checkpoints,
megatron-core's layers and indexed datasets, datasets/tokenizers preprocessing, wandb and
TensorBoard logging). ``--record`` writes its date, versions and outcome into docs/DEPENDENCIES.md.

Only the standard library is used: it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-lock.txt"
DOC = ROOT / "docs" / "DEPENDENCIES.md"
# torch stays pinned by hand (the local CPU wheel; an unpinned torch pulls a CUDA build of several GB)
TORCH = "torch==2.13.0"
LOCK_HEADER = ("# The exact versions `make` installs and CI tested (pip constraints; torch's local label dropped).\n"
               "# Regenerate with `make lock` (docs/DEPENDENCIES.md). Do not edit by hand.\n")
RECORD_BEGIN, RECORD_END = "<!-- drift-runs:begin -->", "<!-- drift-runs:end -->"
# the distributions whose API the ``deps`` tests exercise (the drift record names their versions)
WATCHED = ("torch", "transformers", "tokenizers", "deepspeed", "megatron-core", "lm-eval", "datasets",
           "accelerate", "liger-kernel", "triton", "wandb", "tensorboard", "safetensors", "numpy")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local label (torch's ``+cpu``/``+cu130``)."""
    return version.split("+", 1)[0]


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a lock or ``pip freeze`` output as {canonical name: version}."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not match:
            fail(f"{path}:{number}: {line!r}: expected 'name==version'")
        pins[canonical(match[1])] = public(match[2])
    return pins


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kwargs)


def pip_env(constraint: Path | None) -> dict[str, str]:
    """pip's environment: no cache (what a new machine gets), the constraint file (if any) through
    the environment so that isolated build environments obey it too."""
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_CONSTRAINT", None)
    if constraint is not None:
        env["PIP_CONSTRAINT"] = str(constraint)
    return env


def make_env(venv: Path, python: str, extra: list[str], constraint: Path | None) -> Path:
    """A new virtual environment with the project (``-e .[dev]``) resolved afresh; its python."""
    if venv.exists():
        shutil.rmtree(venv)
    run([python, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    env = pip_env(constraint)
    run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools", "wheel"], env=env, cwd=ROOT)
    run([str(py), "-m", "pip", "install", "-q", TORCH], env=env, cwd=ROOT)
    run([str(py), "-m", "pip", "install", "-q", "-e", ".[dev]", *extra], env=env, cwd=ROOT)
    return py


def freeze(py: Path | str) -> dict[str, str]:
    out = subprocess.run([str(py), "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True,
                         capture_output=True, text=True, env=pip_env(None)).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonical(name)] = public(version.strip())
    return pins


def cmd_lock(args: argparse.Namespace) -> None:
    venv = ROOT / ".venv-lock"
    py = make_env(venv, args.python, [], constraint=None)
    pins = freeze(py)
    old = read_pins(LOCK) if LOCK.exists() else {}
    tmp = LOCK.with_suffix(".tmp")
    tmp.write_text(LOCK_HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))
    tmp.replace(LOCK)
    shutil.rmtree(venv)
    changed = {n: (old.get(n), pins.get(n)) for n in sorted(set(old) | set(pins)) if old.get(n) != pins.get(n)}
    print(f"{LOCK.name}: {len(pins)} distributions; {len(changed)} changed")
    for name, (before, after) in changed.items():
        print(f"  {name}: {before or '-'} -> {after or '-'}")


def differences(lock: dict[str, str], env: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(lock) | set(env)):
        if lock.get(name) != env.get(name):
            lines.append(f"{name}: lock {lock.get(name, 'absent')}, environment {env.get(name, 'absent')}")
    return lines


def cmd_check(args: argparse.Namespace) -> None:
    diff = differences(read_pins(LOCK), freeze(args.python))
    if diff:
        fail(f"the environment of {args.python} differs from {LOCK.name} in {len(diff)} distributions "
             f"({'; '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}); rebuild it with `make clean install`, "
             "or re-resolve the lock with `make lock`")
    print(f"{args.python}: every distribution at {LOCK.name}'s version ({len(read_pins(LOCK))})")


def record(entry: dict) -> None:
    """Insert ``entry`` as the newest row of docs/DEPENDENCIES.md's drift table (kept between markers)."""
    text = DOC.read_text()
    if RECORD_BEGIN not in text or RECORD_END not in text:
        fail(f"{DOC}: the markers {RECORD_BEGIN} / {RECORD_END} are missing")
    head, rest = text.split(RECORD_BEGIN, 1)
    body, tail = rest.split(RECORD_END, 1)
    rows = [ln for ln in body.strip().splitlines() if ln.startswith("| ") and not ln.startswith("| date")]
    row = (f"| {entry['date']} | {entry['environment']} | {entry['differs']} | {entry['outcome']} | "
           f"`{entry['command']}` |")
    table = ["| date | environment | versions that differ from the lock | outcome | command |",
             "|---|---|---|---|---|", row, *rows]
    tmp = DOC.with_suffix(".tmp")
    tmp.write_text(head + RECORD_BEGIN + "\n" + "\n".join(table) + "\n" + RECORD_END + tail)
    tmp.replace(DOC)


def cmd_drift(args: argparse.Namespace) -> None:
    venv = ROOT / ".venv-drift"
    started = time.time()
    # torch stays at its pin (the drift concerns everything else; an upgraded torch is a CUDA build of GBs)
    py = make_env(venv, args.python, ["--upgrade", "--upgrade-strategy", "eager", TORCH, *args.pin],
                  constraint=None)
    pins = freeze(py)
    lock = read_pins(LOCK)
    moved = [f"{n} {lock.get(n, '-')} -> {pins.get(n, '-')}" for n in sorted(set(lock) | set(pins))
             if lock.get(n) != pins.get(n)]
    watched = ", ".join(f"{n} {pins[n]}" for n in WATCHED if n in pins)
    print(f"drift environment: {watched}")
    print("versions that differ from the lock: " + ("; ".join(moved) or "none"))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), WANDB_MODE="disabled",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    pytest = [str(py), "-m", "pytest", "-q", "-m", "deps", "-n", str(args.workers), "--dist", "loadfile",
              "-p", "no:cacheprovider", "tests"]
    print("+ " + " ".join(pytest), file=sys.stderr, flush=True)
    result = subprocess.run(pytest, cwd=ROOT, env=env, capture_output=True, text=True)
    sys.stdout.write(result.stdout[-6000:])
    sys.stderr.write(result.stderr[-3000:])
    summary = next((ln.strip("= ") for ln in reversed(result.stdout.splitlines()) if " in " in ln and
                    ("passed" in ln or "failed" in ln or "error" in ln)), f"pytest exit {result.returncode}")
    outcome = ("pass" if result.returncode == 0 else "FAIL") + f": {summary}"
    print(f"drift check: {outcome} ({time.time() - started:.0f} s with the install)")
    if args.record:
        record({"date": dt.date.today().isoformat(),
                "environment": ("newest in pyproject's ranges" + (f", pinned {' '.join(args.pin)}" if args.pin else ""))
                + f"; {watched}",
                "differs": "; ".join(moved) or "none", "outcome": outcome,
                "command": "make test-latest" + (f" PIN='{' '.join(args.pin)}'" if args.pin else "")})
    if not args.keep:
        shutil.rmtree(venv)
    raise SystemExit(0 if result.returncode == 0 else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lock = sub.add_parser("lock", help="re-resolve inside pyproject's ranges and rewrite requirements-lock.txt")
    lock.add_argument("--python", default=sys.executable, help="the interpreter the environment is made with")
    check = sub.add_parser("check", help="the environment of --python equals the lock")
    check.add_argument("--python", default=sys.executable)
    drift = sub.add_parser("drift", help="the deps tests at the newest versions pyproject allows")
    drift.add_argument("--python", default=sys.executable, help="the interpreter the environment is made with")
    drift.add_argument("--pin", nargs="*", default=[], metavar="SPEC",
                       help="requirements added to the resolution, e.g. transformers==5.23.0")
    drift.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
    drift.add_argument("--record", action="store_true", help="write the outcome into docs/DEPENDENCIES.md")
    drift.add_argument("--keep", action="store_true", help="keep .venv-drift afterwards")
    args = parser.parse_args(argv)
    {"lock": cmd_lock, "check": cmd_check, "drift": cmd_drift}[args.command](args)


if __name__ == "__main__":
    main()
