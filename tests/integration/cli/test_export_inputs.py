"""The tools that read an HF export (``eval_loops.py``, ``probe_geometry.py --model``, and
``from_pretrained`` itself) given exports and flags an operator gets wrong (issue 33): a
``config.json`` edited after the export (before: random blocks loaded, or a ``KeyError``), damaged
files, a plain Llama probed as if it looped, r far beyond K (before: hours without a word), a device
or task folder that is not one. Each is one ``error:`` line, exit 2, before the model runs and with
nothing written. In process, on one untrained tiny export (no training run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hf_fixtures import offline_env
from probe_fixtures import tiny_model, write_prefix

from megatron_loop.cli import run_cli
from megatron_loop.errors import LoopConfigError
from megatron_loop.probes import cli as probe_cli
from testpaths import REPO, load_script

eval_loops = load_script("tools/eval_loops.py").main  # its own run_cli: the exit code the user sees


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> tuple[Path, str]:
    """(a 0+2x3+0 export with scalar injection and Loop Gating, a validation prefix)."""
    from megatron_loop.export.convert import export_state_dict

    root = tmp_path_factory.mktemp("exports")
    model = tiny_model()
    export_state_dict(model.state_dict(), model.config, root / "hf")
    return root / "hf", write_prefix(root)


def _copy(export: Path, tmp_path: Path, **fields) -> Path:
    folder = shutil.copytree(export, tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


def _errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _sweep(model: Path, prefix: str, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--loops", "1,2", "--tasks", "none", "--valid-prefix", prefix,
            "--valid-sequences", "1", "--seq-length", "13", "--no-progress", "--output", str(out), *extra]


def test_r_far_beyond_k_is_refused_before_the_model_loads(export, tmp_path):
    """Before: ``--loops 100000`` on a K = 4 export ran for hours with no output. Refused above 16 K
    (the cost named), before the export's weights are read; 16 K itself is accepted."""
    from megatron_loop.eval.sweep import check_loop_limit

    hf, prefix = export
    args = _sweep(hf, prefix, tmp_path / "out")
    args[args.index("1,2")] = "99"
    start = time.perf_counter()  # the command as a user runs it (interpreter, imports, exit status)
    r = subprocess.run([sys.executable, str(REPO / "tools" / "eval_loops.py"), *args], capture_output=True,
                       text=True, env=offline_env(), timeout=120)
    assert r.returncode == 2 and r.stdout == "" and time.perf_counter() - start < 60, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"error: --loops 99: r = 99 is 33 x the training loop count K = 3 of {hf / 'config.json'} "
        "(each forward costs 33 x one at r = K); expected r <= 16 K = 48, or pass --no-loop-limit to run it anyway"]
    args[args.index("99")] = "100000"  # beyond what the export runs at all (its largest num_loops, 1024)
    r = subprocess.run([sys.executable, str(REPO / "tools" / "eval_loops.py"), *args, "--no-loop-limit"],
                       capture_output=True, text=True, env=offline_env(), timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith(
        "error: --loops 100000: expected loop counts of at most 1024"), r.stderr[-2000:]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    config = json.loads((hf / "config.json").read_text())
    check_loop_limit(hf, config, {"--loops": 48, "--exit-max-loops": None})
    with pytest.raises(LoopConfigError, match=r"^--exit-max-loops 49: r = 49 is 16 x the training loop count K = 3"):
        check_loop_limit(hf, config, {"--loops": 4, "--exit-max-loops": 49})


# config.json edits and damaged files -> the one message both eval_loops.py and probe_geometry.py print
DAMAGE = {
    "core_layers_raised": (dict(core_layers=3), "{hf}: the weights do not match {hf}/config.json (layout 0+3x3+0): "
                           "no weights for model.core.2.*; expected the config.json written with these weights "
                           "(was it edited after the export?)"),
    "core_layers_lowered": (dict(core_layers=1), "{hf}: the weights do not match {hf}/config.json (layout 0+1x3+0): "
                            "weights it has no place for: model.core.1.*; expected the config.json written with "
                            "these weights (was it edited after the export?)"),
    "prelude_from_the_core": (dict(prelude_layers=1, core_layers=1),
                              "{hf}: the weights do not match {hf}/config.json (layout 1+1x3+0): no weights for "
                              "model.prelude.0.*; weights it has no place for: model.core.1.*; expected the "
                              "config.json written with these weights (was it edited after the export?)"),
    "vocab_size": (dict(vocab_size=4096), "{hf}/model.safetensors: model.embed_tokens.weight has shape [2048, 64], "
                   "{hf}/config.json describes [4096, 64]; expected the config.json written with these weights "
                   "(vocab_size, hidden_size, intermediate_size and the heads as exported)"),
    "num_loops_zero": (dict(num_loops=0), "{hf}/config.json: LoopLMConfig.num_loops=0: expected an integer >= 1 (the "
                       "inference loop count r), or None for the training loop count K"),
    "model_code_deleted": ({}, "{hf}/modeling_looplm.py: missing; {hf}/config.json names it in auto_map (the "
                           "model's code); expected the folder as tools/convert_to_hf.py wrote it"),
    "weights_truncated": ({}, "{hf}/model.safetensors: truncated (100,000 bytes; its header describes {size:,}); "
                          "expected the complete file tools/convert_to_hf.py wrote"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_edited_or_damaged_export_is_one_line_in_eval_and_probes(export, tmp_path, capsys, damage):
    fields, message = DAMAGE[damage]
    hf = _copy(export[0], tmp_path, **fields)
    weights = hf / "model.safetensors"
    size = weights.stat().st_size
    if damage == "model_code_deleted":
        (hf / "modeling_looplm.py").unlink()
    if damage == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[:100_000])
    expected = "error: " + message.format(hf=hf, size=size)
    assert eval_loops(_sweep(hf, export[1], tmp_path / "out")) == 2
    assert _errors(capsys) == [expected]
    probe = ["--model", str(hf), "--valid-prefix", export[1], "--loops", "1,2", "--num-sequences", "2",
             "--seq-length", "13", "--num-positions", "all", "--output", str(tmp_path / "probe"), "--no-progress"]
    assert run_cli(probe_cli.main, probe) == 2  # before: a KeyError for core_layers raised
    assert _errors(capsys) == [expected]
    assert not (tmp_path / "out").exists() and not (tmp_path / "probe").exists()


def test_from_pretrained_refuses_weights_that_do_not_fit_the_layout(export, tmp_path):
    """Before: transformers drew model.core.2 at random (its MISSING table the only sign). The
    export's model refuses through transformers' own error list, before that table."""
    from transformers import AutoModelForCausalLM

    hf = _copy(export[0], tmp_path, core_layers=3)
    with pytest.raises(RuntimeError) as e:
        AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=True)
    assert str(e.value).splitlines()[-1].strip() == (
        "LoopLM weights do not match config.json (layout 0+3x3+0): missing model.core.2.*; unused none; expected "
        "the config.json written with these weights (was it edited after the export?)")
    model = AutoModelForCausalLM.from_pretrained(export[0], trust_remote_code=True)  # as exported: loads
    assert model.config.core_layers == 2


def test_probes_refuse_a_plain_llama_and_an_output_file(export, tmp_path, capsys):
    """Before: a LlamaForCausalLM was probed as 0+2x1+0 and its whole stack looped; an --output file
    failed at the end with a traceback."""
    from transformers import LlamaConfig, LlamaForCausalLM

    plain = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(plain)
    common = ["--valid-prefix", export[1], "--loops", "1,2", "--num-sequences", "2", "--seq-length", "13",
              "--num-positions", "all", "--no-progress"]
    assert run_cli(probe_cli.main, ["--model", str(plain), *common, "--output", str(tmp_path / "p")]) == 2
    assert _errors(capsys) == [
        f"error: --model {plain}: config.json model_type 'llama' (a plain LlamaForCausalLM, no recurrence); expected "
        "a LoopLM export (model_type 'looplm', written by tools/convert_to_hf.py)"]
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert run_cli(probe_cli.main, ["--model", str(export[0]), *common, "--output", str(afile)]) == 2
    assert _errors(capsys) == [f"error: --output {afile}: exists and is not a folder; expected a folder for "
                               "geometry.json and the figures"]
    assert afile.read_text() == "mine" and not (tmp_path / "p").exists()


@pytest.mark.parametrize("extra,message", [
    (["--device", "tpu"], "--device tpu: not a device this tool runs on; expected cpu, cuda or cuda:N (default: "
                          "cuda when available)"),
    (["--include-path", str(REPO / "README.md")],
     f"--include-path {REPO / 'README.md'}: not a folder; expected a folder of lm-eval task YAML files (such as the "
     "demo's data/corpus/eval)"),
    (["--include-path", "{tmp}"], "--include-path {tmp}: no *.yaml in it; expected a folder of lm-eval task YAML "
                                  "files (such as the demo's data/corpus/eval)"),
])
def test_eval_device_and_task_folder_are_checked_first(export, tmp_path, capsys, extra, message):
    """Before: ``--device tpu`` was a torch traceback after the model loaded; ``--include-path
    README.md`` ended in lm-eval's "task not found"."""
    extra = [e.format(tmp=tmp_path) for e in extra]
    assert eval_loops(_sweep(export[0], export[1], tmp_path / "out", *extra)) == 2
    assert _errors(capsys) == ["error: " + message.format(tmp=tmp_path)]
