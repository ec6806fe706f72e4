"""Bad inputs closed as a class (issue 43): every command line's arguments, fuzzed (hypothesis).

For each CLI, command lines that reach its work (training's process group, an export's consolidation, a
sweep's model load, ...: ``fuzz_fixtures.WORK``) get one to three of their arguments -- drawn from the
script's own argparse parser -- replaced by garbage text, numbers at and past every edge, paths of every
kind (missing, a folder, ``/dev/null``, ``/dev/zero``, the wrong asset), dropped, or joined by an unknown
word. The invariants of docs/ERRORS.md hold for every one: accepted, or exit 2 with exactly one
``error:`` line and nothing written; no traceback; bounded time (``fuzz_fixtures.check``). Each runs in
this process through the script's ``main(argv)``; one refused command line per CLI also runs as a real
process, whose exit code and error line the in-process run must equal.

The sample here is derandomized; ``LOOPLM_FUZZ_EXAMPLES=N`` runs N random examples per CLI
(tests/support/fuzz_fixtures.py).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given

from fuzz_fixtures import check, fuzz_assets, fuzz_settings, run_entry, snapshot
from fuzz_strategies import command_lines
from testpaths import REPO
from train_fixtures import env


def bases(a) -> dict[str, list[list[str]]]:
    """Per script: command lines that pass every check and reach the work."""
    valid = a.prefix + "_valid"
    return {
        "pretrain_loop.py": [["--config", str(a.config), "--dry-run"], ["--config", str(a.config)],
                             ["--config", str(a.config), "--print-config"], ["--list-configs"]],
        "tools/preprocess_data.py": [["--input", str(a.corpus), "--tokenizer", str(a.tokenizer),
                                      "--output-prefix", "out/p", "--no-progress"]],
        "tools/train_tokenizer.py": [["--input", str(a.corpus), "--output", "tok", "--vocab-size", "300"]],
        "tools/convert_to_hf.py": [["--checkpoint", str(a.checkpoint), "--output", "hf"]],
        "tools/eval_loops.py": [["--model", str(a.export), "--loops", "1,2", "--tasks", "none", "--valid-prefix", valid,
                                 "--output", "ev", "--no-progress"]],
        "tools/probe_geometry.py": [["--model", str(a.export), "--loops", "1,2", "--valid-prefix", valid,
                                     "--seq-length", "16", "--num-sequences", "2", "--output", "probe"],
                                    ["--checkpoint", str(a.checkpoint), "--loops", "1", "--valid-prefix", valid,
                                     "--seq-length", "16", "--num-sequences", "2", "--output", "probe"]],
        "tools/plot_metrics.py": [[str(a.metrics), "--output", "m.png"]],
        "tools/bench.py": [["--device", "cpu", "--mode", "data"], ["--device", "cpu", "--mode", "checkpointing",
                                                                   "--loops", "2"]],
        "tools/make_corpus.py": [["--output-dir", "corpus", "--prose-docs", "5"]],
        "tools/generate_configs.py": [["--study", "toy", "--toy-env"], ["--list-studies"],
                                      ["--study", "toy", "--toy-dir", "twins"], []],
        # only its parser (tools/paired_study.py is being rewritten elsewhere)
        "tools/paired_study.py": [["plan", "--study", "finding1_paired"],
                                  ["eval", "--model", str(a.export), "--loops", "1,2", "--include-path", "ev",
                                   "--output", "o"], ["analyse", "--study", "finding1_paired", "--run", "r"]],
    }


SCRIPTS = ["pretrain_loop.py", "tools/preprocess_data.py", "tools/train_tokenizer.py", "tools/convert_to_hf.py",
           "tools/eval_loops.py", "tools/probe_geometry.py", "tools/plot_metrics.py", "tools/bench.py",
           "tools/make_corpus.py", "tools/generate_configs.py", "tools/paired_study.py"]
EXAMPLES = 12  # per CLI in the sample


@pytest.fixture(scope="module")
def assets():
    a = fuzz_assets()
    before = snapshot(a.root)
    yield a
    assert snapshot(a.root) == before, "a fuzzed call changed the shared assets"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_argument_of_every_cli(assets, script):
    for argv in bases(assets)[script]:  # the bases themselves are accepted
        outcome = run_entry(script, argv)
        assert outcome.accepted, (argv, outcome.describe())

    @fuzz_settings(EXAMPLES)
    @given(argv=command_lines(script, bases(assets)[script], assets))
    def fuzzed(argv):
        check(run_entry(script, argv, watch=assets.folders()))

    fuzzed()


# One refused command line per CLI as a real process: the interpreter-level path (imports, __main__, the exit
# status) prints what the in-process run prints.
PROCESS_CASES = {
    "pretrain_loop.py": ["--config", "missing.yaml", "--dry-run"],
    "tools/preprocess_data.py": ["--input", "missing.jsonl", "--tokenizer", "missing", "--output-prefix", "o/p",
                                 "--max-documents", "-1"],
    "tools/train_tokenizer.py": ["--input", "missing.jsonl", "--output", "tok", "--vocab-size", "1000000000"],
    "tools/convert_to_hf.py": ["--checkpoint", "/dev/null", "--output", "hf"],
    "tools/eval_loops.py": ["--model", "missing", "--loops", "1", "--tasks", ""],
    "tools/probe_geometry.py": ["--model", "missing", "--valid-prefix", "p", "--output", "o", "--batch-size", "0"],
    "tools/plot_metrics.py": ["missing_run", "--output", "m.txt"],
    "tools/bench.py": ["--device", "cpu", "--mode", "train", "--loops", "0"],
    "tools/make_corpus.py": ["--output-dir", "/dev/null"],
    "tools/generate_configs.py": ["--study", "nosuch", "--toy-env"],
    "tools/paired_study.py": ["plan"],
}


@pytest.mark.slow
def test_each_cli_as_a_process_prints_what_it_prints_in_process(tmp_path):
    def process(script):
        return subprocess.run([sys.executable, str(REPO / script), *PROCESS_CASES[script]], cwd=tmp_path,
                              env=env(), capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(PROCESS_CASES, pool.map(process, PROCESS_CASES)))
    for script, result in results.items():
        inside = run_entry(script, PROCESS_CASES[script])
        errors = [line for line in result.stderr.splitlines() if "error: " in line]
        assert (result.returncode, inside.code) == (2, 2), (script, result.stderr[-2000:], inside.describe())
        assert "Traceback" not in result.stderr and len(errors) == 1, (script, result.stderr[-2000:])
        # argparse names the program after argv[0]: compare what follows "error: "
        assert errors[0].split("error: ", 1)[1] == inside.errors[0].split("error: ", 1)[1], script
        assert not list(tmp_path.iterdir()), f"{script} wrote {list(tmp_path.iterdir())}"
