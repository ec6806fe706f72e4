"""The bad inputs issue 43 found (round 4 of the researcher's first week: a hang, tracebacks, silent and unclear
answers), each asserted at the command line: refused with exit 2 and the one ``error:`` line of
docs/ERRORS.md, nothing written, or (where the input is fine but was silently changed) said on a
``warning:`` / ``note:`` line. In this process through each script's ``main(argv)``, stopped where its work
starts (``fuzz_fixtures.run_entry``); tests/integration/cli/test_fuzz_cli.py and test_fuzz_config.py check
the class around them, tests/integration/hf/test_export_call_checks.py the export's Python API."""

from __future__ import annotations

import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from fuzz_fixtures import fuzz_assets, refused, run_entry
from testpaths import REPO
from train_fixtures import env


@pytest.fixture(scope="module")
def a():
    return fuzz_assets()


def dry(a, *overrides: str, env_vars=None, training: bool = False):
    argv = ["--config", str(a.config), *(["--dry-run"] if not training else [])]
    for o in overrides:
        argv += ["--set", o]
    return run_entry("pretrain_loop.py", argv, env=env_vars, watch=a.folders())


# ---- tracebacks before


def test_a_launch_variable_that_is_not_a_number(a):
    refused(dry(a, env_vars={"WORLD_SIZE": "abc"}), r"^error: environment variable WORLD_SIZE='abc': expected an "
                                                    r"integer >= 1 \(the number of ranks the launcher started\)$")
    refused(dry(a, training=True, env_vars={"LOCAL_RANK": "x", "WORLD_SIZE": "1"}),
            r"environment variable LOCAL_RANK='x': expected an integer >= 0")
    refused(dry(a, env_vars={"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
            r"RANK=2: expected a rank below WORLD_SIZE=2")
    refused(dry(a, env_vars={"WORLD_SIZE": "2", "RANK": "1"}),  # a launcher's RANK without its rendezvous
            r"RANK=1 without MASTER_ADDR, MASTER_PORT: expected WORLD_SIZE, MASTER_ADDR and MASTER_PORT with it")


def test_the_fused_loss_without_cuda(a, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this host as a CPU machine
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    planned = dry(a, "model.loss_implementation=fused")  # a dry run on a login node plans a GPU job
    assert planned.code == 0 and "warning: model.loss_implementation='fused': Liger's Triton kernel needs a CUDA " \
                                  "device" in planned.stderr, planned.describe()
    refused(dry(a, "model.loss_implementation=fused", training=True),  # before the process group, not a rank's traceback
            r"model\.loss_implementation='fused': Liger's Triton kernel needs a CUDA device .* expected 'auto'")


def test_tool_counts_that_raised(a):
    refused(run_entry("tools/preprocess_data.py", ["--input", str(a.corpus), "--tokenizer", str(a.tokenizer),
                                                   "--output-prefix", "o/p", "--max-documents", "-1"]),
            r"^error: --max-documents -1: expected an integer >= 1$")
    refused(run_entry("tools/train_tokenizer.py", ["--input", str(a.corpus), "--output", "tok", "--vocab-size",
                                                   "1000000000"]),  # a Rust allocation abort (exit 134) before
            r"vocab_size 1,000,000,000: expected at most 1,048,576")
    refused(run_entry("tools/bench.py", ["--device", "cpu", "--mode", "checkpointing", "--loops", "0"]),
            r"^error: --loops '0': expected loop counts r >= 1")


# ---- accepted without a word before


def test_learning_rates_past_any_sense(a):
    for lr in ("1e10", "1.0e308"):
        refused(dry(a, f"train.lr={lr}"), r"train\.lr=[0-9.e+]+: expected at most 1 \(a peak learning rate")
    assert dry(a, "train.lr=1.0").code == 0


def test_an_exit_gate_with_one_loop(a):
    refused(dry(a, "model.exit_gate=learned", "train.exit_gate_objective=entropy_regularized", "model.train_loops=1"),
            r"model\.exit_gate='learned' with model\.train_loops=1: expected train_loops >= 2")


@pytest.mark.parametrize("target,pattern", [
    ("nothing_there", r"train\.init_from='.*nothing_there': .*nothing_there: checkpoint folder not found$"),
    ("export", r"train\.init_from='.*hf': .*hf: a Hugging Face export \(config\.json and safetensors"),
    ("file", r"train\.init_from='.*tiny\.yaml': .*tiny\.yaml: a file, not a checkpoint folder"),
])
def test_init_from_checked_by_the_dry_run(a, target, pattern):
    path = {"nothing_there": a.root / "nothing_there", "export": a.export, "file": a.config}[target]
    refused(dry(a, f"train.init_from={path}"), pattern)


def test_init_from_a_checkpoint_passes_the_dry_run(a):
    assert dry(a, f"train.init_from={a.checkpoint}").code == 0


def test_workers_beyond_the_cores(a):
    cores = len(os.sched_getaffinity(0))
    refused(dry(a, "data.num_workers=100000"), rf"data\.num_workers=100000: expected at most the {cores} CPU cores")
    refused(run_entry("tools/preprocess_data.py", ["--input", str(a.corpus), "--tokenizer", str(a.tokenizer),
                                                   "--output-prefix", "o/p", "--workers", "1000"]),
            rf"--workers 1000: expected at most the {cores} CPU cores")


def test_a_shard_size_below_the_largest_tensor(a):
    refused(run_entry("tools/convert_to_hf.py", ["--checkpoint", str(a.checkpoint), "--output", "hf",
                                                 "--max-shard-size", "1"]),
            r"--max-shard-size 1: 1 bytes, below the model's largest tensor \(40,960 bytes in fp32\)")
    assert str(run_entry("tools/convert_to_hf.py", ["--checkpoint", str(a.checkpoint), "--output", "hf",
                                                    "--max-shard-size", "50KB"]).code).startswith("reached")


def test_a_limit_that_leaves_one_item_is_said():
    from megatron_loop.eval.sweep import SweepSettings, limit_warnings

    settings = SweepSettings(loops=[1], tasks=[SimpleNamespace(key="facts")], limit=0.0001, valid_prefix=None)
    tasks = {"looplm_facts_local": SimpleNamespace(eval_docs=list(range(120)))}
    assert limit_warnings(settings, tasks) == [
        "warning: --limit 0.0001 keeps 1 of the 120 items of lm-eval task 'looplm_facts_local': its score moves by "
        "100 points per item; pass a larger --limit (or none) for a score to compare"]
    settings.limit = 0.5
    assert limit_warnings(settings, tasks) == []


def test_more_validation_sequences_than_the_prefix_holds_is_said(a):
    outcome = run_entry("tools/eval_loops.py", ["--model", str(a.export), "--loops", "1", "--tasks", "none",
                                                "--valid-prefix", a.prefix + "_valid", "--valid-sequences", "1000000"])
    assert outcome.code == "reached model load", outcome.describe()
    assert f"note: --valid-sequences 1,000,000: {a.prefix}_valid holds " in outcome.stderr
    assert "sequences of 16 tokens; the held-out loss reads all of them" in outcome.stderr


def test_a_run_given_twice_to_plot_metrics(a):
    refused(run_entry("tools/plot_metrics.py", [str(a.metrics), str(a.metrics / "metrics.jsonl")]),
            r"RUN '.*metrics\.jsonl': the run of '.*metrics_run' again; expected each run once")


def test_bench_options_its_mode_does_not_read(a):
    refused(run_entry("tools/bench.py", ["--device", "cpu", "--mode", "train", "--loops", "0"]),
            r"--loops: read only by --mode checkpointing, recompute, backprop; expected it with one of them")


# ---- unclear before


def test_a_nan_in_a_list_names_the_item(a):
    refused(dry(a, "data.train_weights=[.nan]"), r"data\.train_weights\[0\]=nan: expected a finite number$")


def test_a_config_that_is_a_folder_or_a_device(a):
    refused(run_entry("pretrain_loop.py", ["--config", str(a.root), "--dry-run"]),
            rf"^error: {a.root} is a folder, not a regular file; expected a YAML config file$")
    refused(run_entry("pretrain_loop.py", ["--config", "/dev/null", "--dry-run"]),
            r"^error: /dev/null is a character device, not a regular file; expected a YAML config file$")


@pytest.mark.parametrize("script,argv", [
    ("tools/convert_to_hf.py", ["--output", "hf", "--checkpoint"]),
    ("tools/probe_geometry.py", ["--valid-prefix", "P", "--output", "probe", "--checkpoint"]),
])
def test_an_export_where_a_checkpoint_is_expected(a, script, argv):
    argv = [*argv, str(a.export)]
    argv = [v if v != "P" else a.prefix + "_valid" for v in argv]
    refused(run_entry(script, argv), rf"{a.export}: a Hugging Face export \(config\.json and safetensors, "
                                     r"tools/convert_to_hf\.py\), not a training checkpoint")


def test_a_tokenizer_json_is_read_as_its_folder(a):
    file = str(a.tokenizer / "tokenizer.json")
    assert run_entry("tools/preprocess_data.py", ["--input", str(a.corpus), "--tokenizer", file,
                                                  "--output-prefix", "o/p"]).code == "reached first write"
    assert run_entry("tools/convert_to_hf.py", ["--checkpoint", str(a.checkpoint), "--output", "hf", "--tokenizer",
                                                file]).code == "reached consolidation"
    refused(run_entry("tools/preprocess_data.py", ["--input", str(a.corpus), "--tokenizer", str(a.config),
                                                   "--output-prefix", "o/p"]),
            r"--tokenizer .*tiny\.yaml: a file, not a tokenizer folder")


def test_convert_output_that_is_a_run_or_empty(a):
    refused(run_entry("tools/convert_to_hf.py", ["--checkpoint", str(a.checkpoint), "--output", str(a.checkpoint)]),
            rf"--output {a.checkpoint}: holds a training run or checkpoints \(latest, looplm_config\.json, global_step1\); "
            r"--overwrite replaces only an export")  # said first, not "pass --overwrite" (then refused)
    refused(run_entry("tools/convert_to_hf.py", ["--checkpoint", str(a.checkpoint), "--output", ""]),
            r"^error: --output '': expected the path of a folder for the export")


def test_a_task_yaml_field_lm_eval_does_not_know(a, tmp_path):
    (tmp_path / "items.jsonl").write_text('{"query": "q", "choices": ["a", "b"], "gold": 0}\n')
    (tmp_path / "mine.yaml").write_text(
        f"task: fuzz_mine\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'items.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: query\ndoc_to_choice: choices\n"
        "doc_to_target: gold\ndoc_to_txet: query\n")
    refused(run_entry("tools/eval_loops.py", ["--model", str(a.export), "--loops", "1", "--tasks", "fuzz_mine",
                                              "--include-path", str(tmp_path), "--no-progress"]),
            r"lm-eval task 'fuzz_mine': its YAML sets 'doc_to_txet', a field lm-eval's task config does not have")


def test_empty_tasks_are_not_the_default_tasks(a):
    refused(run_entry("tools/eval_loops.py", ["--model", str(a.export), "--loops", "1", "--tasks", ""]),
            r"^error: --tasks '': expected task names .*'none' for the held-out loss only")


def test_probe_counts_before_the_checkpoint_loads(a):
    for flag in ("--batch-size", "--skip-batch", "--num-sequences"):
        outcome = run_entry("tools/probe_geometry.py", ["--checkpoint", str(a.checkpoint), "--valid-prefix",
                                                        a.prefix + "_valid", "--output", "probe", flag, "0"])
        refused(outcome, rf"^error: {flag} 0: expected an integer >= 1$")  # "reached model load" before


def test_an_unknown_key_says_what_was_meant(a):
    refused(dry(a, "train.learning_rate=1"), r"train\.learning_rate: unknown key; did you mean 'lr'\?")
    refused(dry(a, "model.hiden_size=64"), r"model\.hiden_size: unknown key; did you mean 'hidden_size'\?")
    refused(dry(a, "trian.lr=1"), r"unknown section 'trian'; did you mean 'train'\?")
    refused(dry(a, "train.zzz=1"), r"train\.zzz: unknown key; expected one of \['adam_beta1'")  # nothing close


# ---- the small-study script (bash): its knobs before any data is built, exit 2


@pytest.mark.parametrize("study,knob,pattern", [
    ("nosuch", {}, r"error: --study 'nosuch': unknown study"),
    ("toy", {"STUDY_STEPS": "abc"}, r"error: STUDY_STEPS='abc': expected a positive integer"),
    ("toy", {"STUDY_LIMIT": "-1"}, r"error: STUDY_LIMIT='-1': expected lm-eval items per task"),
    ("toy", {"STUDY_JOBS": "0"}, r"error: STUDY_JOBS='0': expected a positive integer"),
])
def test_small_study_knobs(tmp_path, study, knob, pattern):
    result = subprocess.run(["bash", str(REPO / "tools" / "small_study.sh"), study], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**env(), "STUDY_RUN": str(tmp_path / "run"), **knob})
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(pattern, errors[0]), result.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # refused before the study's folder and data

