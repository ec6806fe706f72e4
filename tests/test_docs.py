"""The README's commands (issue: quickstart): every script and example it names exists, every
script answers --help, every config it names loads; the Makefile has the two commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_loop.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CODE = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S)) + "\n" + "\n".join(
    re.findall(r"`([^`\n]+)`", README))

SCRIPTS = sorted(set(re.findall(r"(?<![\w/])(tools/\w+\.py|pretrain_loop\.py)", CODE)))
CONFIGS = sorted(set(re.findall(r"\b(examples/[\w.+-]+\.yaml)\b", CODE)))
FILES = sorted(set(re.findall(r"\b((?:deepspeed_configs|examples)/[\w.+-]+)\b", CODE)))


def test_readme_names_the_pipeline():
    for needle in ("make demo", "make test", "tools/preprocess_data.py", "pretrain_loop.py", "tools/convert_to_hf.py",
                   "tools/eval_loops.py", "tools/probe_geometry.py", "tools/bench.py", "--hostfile", "sbatch"):
        assert needle in README, needle
    assert len(SCRIPTS) >= 6 and len(CONFIGS) >= 2


@pytest.mark.parametrize("script", SCRIPTS)
def test_readme_script_answers_help(script):
    path = ROOT / script
    assert path.is_file(), f"README names {script}, which does not exist"
    out = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower()


@pytest.mark.parametrize("name", FILES)
def test_readme_files_exist(name):
    assert (ROOT / name).exists(), name


@pytest.mark.parametrize("config", CONFIGS)
def test_readme_configs_load(config):
    load_config(ROOT / config)


def test_makefile_and_ci_entry_points():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:", makefile, flags=re.M) and re.search(r"^demo:", makefile, flags=re.M)
    assert 'pip install "torch==2.13.0"' in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_config_reference_documents_every_key():
    out = subprocess.run([sys.executable, "tools/config_reference.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
