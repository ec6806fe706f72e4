"""What the README and docs/*.md quote is real: every command that runs one of the repository's
scripts parses with that script's own argparse parser, every file of the repository they name
exists, every config they name loads with the ``--set`` overrides its command gives, and every
``--set key=value`` they quote names a config key whose value validates. The commands are parsed
in this process and stop right after parsing (nothing trains); the scripts answer ``--help``.
"""

from __future__ import annotations

import argparse
import json
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from megatron_loop.config import load_config
from megatron_loop.errors import LoopConfigError
from testpaths import REPO

ROOT = REPO
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPT = r"(?:tools/\w+\.py|pretrain_loop\.py)"
LAUNCHER = re.compile(r"^(?:python3?|deepspeed|torchrun|srun|\.venv/bin/python)\b")
# the placeholders the docs write for "any key" (docs/CONFIG.md, the Slurm example)
PLACEHOLDER_OVERRIDES = {"key.path=value", "section.key=value"}
BASE_CONFIG = ROOT / "examples" / "tiny_2x3.yaml"


def code_spans(path: Path) -> list[str]:
    """The lines of the fenced blocks (continuations joined, comments dropped) and the inline
    code spans outside them."""
    text = path.read_text()
    spans = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if line:
                spans.append(line)
    spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return spans


def quoted_commands() -> list[tuple[str, str, str, list[str]]]:
    """(doc, command, script, arguments) of every quoted command that runs one of our scripts.
    Optional ``[--flag ...]`` groups, ``...``, ``&`` and ``"$@"`` are dropped; a shell variable
    stays a plain value."""
    out = []
    for doc in DOCS:
        for span in code_spans(doc):
            span = re.sub(r"^mkdir -p \S+ && ", "", span)
            found = re.search(rf"(?:^|\s)({SCRIPT})(?:\s|$)", span)
            if not LAUNCHER.match(span) or not found:
                continue
            rest = re.sub(r"\s\[--[^\]]*\]", "", span[found.end(1):])
            args = [a for a in shlex.split(rest) if a not in ("...", "&", "$@")]
            out.append((doc.name, span, found.group(1), args))
    return out


COMMANDS = quoted_commands()


class _Parsed(BaseException):
    """Raised by the patched ``parse_args`` to stop a script right after parsing (a BaseException,
    so that no ``except Exception`` of the script catches it)."""

    def __init__(self, namespace: argparse.Namespace):
        super().__init__()
        self.namespace = namespace


def parse_like_the_script(script: str, args: list[str]) -> argparse.Namespace | None:
    """Run ``script`` as ``__main__`` with ``args`` until its parser returns (None for ``--help``);
    argparse's error (``SystemExit``) propagates."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, argv=None, namespace=None):
        raise _Parsed(original(parser, argv, namespace))

    path = ROOT / script
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            mock.patch.object(sys, "argv", [str(path), *args]), \
            mock.patch.object(sys, "path", [str(path.parent), *sys.path]):  # as `python SCRIPT` sets it
        try:
            runpy.run_path(str(path), run_name="__main__")
        except _Parsed as parsed:
            return parsed.namespace
        except SystemExit as e:
            if e.code == 0 and "--help" in args:  # argparse printed the help
                return None
            raise
    raise AssertionError(f"{script} returned without parsing its command line")


def test_the_docs_quote_the_pipeline():
    scripts = {script for _, _, script, _ in COMMANDS}
    assert {"pretrain_loop.py", "tools/preprocess_data.py", "tools/convert_to_hf.py", "tools/eval_loops.py",
            "tools/probe_geometry.py", "tools/bench.py", "tools/generate_configs.py"} <= scripts
    assert len(COMMANDS) >= 60


@pytest.mark.parametrize("doc, command, script, args", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c, _, _ in COMMANDS])
def test_quoted_command_parses_and_its_config_loads(doc, command, script, args, capsys):
    try:
        namespace = parse_like_the_script(script, args)
    except SystemExit as e:
        raise AssertionError(f"{doc}: `{command}` does not parse: {capsys.readouterr().err.strip()}") from e
    config = getattr(namespace, "config", None) if namespace is not None else None
    if config and "$" not in config:
        assert (ROOT / config).is_file(), f"{doc}: `{command}`: no config {config}"
    if script == "pretrain_loop.py" and config and "$" not in config:
        try:
            load_config(ROOT / config, namespace.overrides)
        except LoopConfigError as e:
            raise AssertionError(f"{doc}: `{command}`: {e}") from e


def _named_files() -> list[tuple[str, str]]:
    """(doc, path) of every repository file or folder named in the docs' code (``tools/x.sh``,
    ``examples/...``, ``deepspeed_configs/...``, ``tests/...``; a ``*`` is a glob, ``<...>`` a placeholder)."""
    pattern = re.compile(r"(?<![\w/.-])((?:examples|deepspeed_configs|tools|tests)/[\w.+*/-]*[\w*])(?![\w<])")
    out = set()
    for doc in DOCS:
        for span in code_spans(doc):
            out.update((doc.name, p) for p in pattern.findall(span) if "<" not in p)
    return sorted(out)


FILES = _named_files()


def test_every_file_the_docs_name_exists():
    assert len(FILES) >= 20
    assert sum(path.startswith("tests/") for _, path in FILES) >= 20  # the test files docs name are checked too
    missing = [f"{doc}: {path}" for doc, path in FILES if not list(ROOT.glob(path))]
    assert not missing, missing


def _named_tests() -> list[tuple[str, str, str]]:
    """(doc, test file, test function) of every ``FILE.py::test_name`` the docs' code names: paths from
    the repository (``tests/...``) or, in docs/RELIABILITY.md's fault table, from ``tests/integration/``;
    ``::test_name`` after a comma repeats the file before it."""
    out = set()
    for doc in DOCS:
        for span in code_spans(doc):
            for path, name in re.findall(r"((?:tests/[\w/]+|reliability/\w+|training/\w+)\.py)::(\w+)", span):
                out.add((doc.name, path if path.startswith("tests/") else f"tests/integration/{path}", name))
    return sorted(out)


def test_every_test_the_docs_name_exists():
    named = _named_tests()
    assert len(named) >= 30
    missing = [f"{doc}: {path}::{name}" for doc, path, name in named
               if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M)]
    assert not missing, missing


BARE_OVERRIDE = re.compile(r"(model|train|data|logging)\.\w+=\S+")


def _tokens(span: str) -> list[str]:
    try:
        return shlex.split(span)
    except ValueError:  # prose with an apostrophe
        return span.split()


def _quoted_overrides() -> list[tuple[str, str, tuple[str, ...]]]:
    """(doc, config, overrides) to validate together: the ``--set`` values of each quoted command
    or option span, on its ``--config`` (else the tiny CPU config), and the bare
    ``section.key=value`` spans of each paragraph, on the config the paragraph names (else the
    tiny one). Spans with ``<placeholders>`` (the error messages of docs/ERRORS.md) are skipped."""
    out = set()
    tiny = str(BASE_CONFIG.relative_to(ROOT))
    for doc in DOCS:
        for span in code_spans(doc):
            if "<" in span or not (LAUNCHER.match(span) or span.startswith("--")):
                continue
            tokens = _tokens(span)
            sets = tuple(b for a, b in zip(tokens, tokens[1:]) if a == "--set" and b not in PLACEHOLDER_OVERRIDES)
            configs = [b for a, b in zip(tokens, tokens[1:]) if a == "--config" and "$" not in b]
            if sets:
                out.add((doc.name, configs[0] if configs else tiny, sets))
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for paragraph in prose.split("\n\n"):
            spans = re.findall(r"`([^`\n]+)`", paragraph)
            sets = tuple(span for span in spans if BARE_OVERRIDE.fullmatch(span))
            configs = [span for span in spans if re.fullmatch(r"examples/\S+\.yaml", span)]
            if sets:
                out.add((doc.name, configs[0] if configs else tiny, sets))
    return sorted(out)


OVERRIDES = _quoted_overrides()


def test_every_quoted_override_is_a_key_that_validates():
    """An unknown key or a value the config refuses is an error."""
    assert sum(len(sets) for _, _, sets in OVERRIDES) >= 20
    bad = []
    for doc, config, overrides in OVERRIDES:
        try:
            load_config(ROOT / config, list(overrides))
        except LoopConfigError as e:
            bad.append(f"{doc}: {config} --set {' --set '.join(overrides)}: {e}")
    assert not bad, bad


def test_the_checks_catch_what_they_are_for(capsys):
    """A misspelt flag and a misspelt key are caught; optional groups of a usage line are dropped."""
    with pytest.raises(SystemExit):
        parse_like_the_script("tools/eval_loops.py", ["--model", "hf/x", "--loops", "1", "--loopz", "2"])
    assert "unrecognized arguments: --loopz" in capsys.readouterr().err
    assert parse_like_the_script("pretrain_loop.py", ["--config", "examples/tiny_2x3.yaml", "--set",
                                                      "train.lr=1e-3"]).overrides == ["train.lr=1e-3"]
    with pytest.raises(LoopConfigError, match="trian"):
        load_config(BASE_CONFIG, ["trian.lr=1e-3"])
    commands = {command for _, command, _, _ in COMMANDS}
    assert "python tools/convert_to_hf.py --checkpoint runs/tiny/checkpoints --output runs/tiny/hf" in {
        re.sub(r"\s\[--[^\]]*\]", "", c) for c in commands}  # optional [--flag] groups dropped


SCRIPTS = sorted({script for _, _, script, _ in COMMANDS})


@pytest.mark.parametrize("script", SCRIPTS)
def test_quoted_script_answers_help(script):
    out = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower()


def test_makefile_and_ci_entry_points():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:", makefile, flags=re.M) and re.search(r"^demo:", makefile, flags=re.M)
    # every install is held to the lock (torch 2.13.0 included: tests/integration/tools/test_install_lock.py) and checked against it
    assert "PIP_CONSTRAINT=$(CURDIR)/$(LOCK)" in makefile and "LOCK   := requirements-lock.txt" in makefile
    assert "$(PY) tools/deps.py check" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_config_reference_documents_every_key():
    out = subprocess.run([sys.executable, "tools/config_reference.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_demo_numbers_in_the_docs_are_rendered_from_what_the_demo_printed(tmp_path):
    """The README's and docs/REPRODUCE.md's demo paragraphs are tools/demo_docs.py's rendering of
    docs/demo_reference.json (the numbers the demo printed; tests/integration/tools/test_demo.py ties that
    file to the demo's output): a number typed over them, or a block left stale, fails here."""
    from testpaths import load_script

    docs = load_script("tools/demo_docs.py")
    assert docs.main(["--check"]) == 0
    reference = json.loads((ROOT / "docs" / "demo_reference.json").read_text())
    assert docs.stale(reference) == []
    # a typed number is caught: change one score in the README's block
    full = reference["full"]
    k = str(full["train_loops"])
    task = docs._learned(full, k)[0]  # a task the demo learned: the README quotes its score at r = K
    edited = {**full, "tasks": {**full["tasks"], task: {**full["tasks"][task], k: full["tasks"][task][k] + 1}}}
    assert docs.readme_block(edited) != docs.readme_block(full)
    assert docs.stale({**reference, "full": edited}) != []
    for name in ("demo_geometry_trajectory.png", "demo_geometry_interaction.png"):
        assert (ROOT / "docs" / "figures" / name).read_bytes()[:4] == b"\x89PNG"
