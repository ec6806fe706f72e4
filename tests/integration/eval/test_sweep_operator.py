"""``tools/eval_loops.py`` as an operator meets it: the held-out loss is measured at the length the
model was trained on (recorded in the export), the output is checked before any work, every r is
written as it completes, an interrupted sweep resumes, a sweep of other settings is refused rather
than replaced, ``--device cuda`` without CUDA is one line, and hub tasks without a network fail in
seconds with one line naming them."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from data_fixtures import REPO, data_assets
from hf_fixtures import hf_assets, offline_env

pytestmark = pytest.mark.slow

MODEL = "base_llama"  # 0+2x3+0, trained (and exported) at the fixtures' seq_length
VALID = ["--tasks", "none", "--valid-sequences", "3", "--batch-size", "3", "--no-progress"]


def _main():
    spec = importlib.util.spec_from_file_location("eval_loops_tool", REPO / "tools" / "eval_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


INTERRUPTED = ("error: interrupted (SIGINT): stopped; outputs are published only when complete, so nothing "
               "half-written is left")


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _main()(args)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "hf"
    shutil.copytree(hf_assets().exports[MODEL], folder)
    return folder


def _trained_length(export: Path) -> int:
    return json.loads((export / "config.json").read_text())["train_seq_length"]


def test_export_records_the_training_length_and_the_sweep_defaults_to_it(export, tmp_path):
    from megatron_loop.checkpoint.folders import load_run_config

    trained = _trained_length(export)
    assert trained == load_run_config(hf_assets().checkpoints[MODEL]).train.seq_length
    code, _, err = _run(["--model", str(export), "--loops", "1,3", "--valid-prefix", data_assets().prefix + "_valid",
                         "--output", str(tmp_path / "default"), *VALID])
    assert code == 0 and "warning" not in err, err
    results = json.loads((tmp_path / "default" / "results.json").read_text())
    assert results["seq_length"] == trained

    code, _, err = _run(["--model", str(export), "--loops", "1", "--valid-prefix", data_assets().prefix + "_valid",
                         "--seq-length", str(2 * trained), "--output", str(tmp_path / "longer"), *VALID])
    assert code == 0 and f"warning: --seq-length {2 * trained} is longer than the {trained} tokens the model was " \
                          f"trained on ({export / 'config.json'} train_seq_length)" in err, err
    assert json.loads((tmp_path / "longer" / "results.json").read_text())["seq_length"] == 2 * trained


def test_an_export_without_the_field_loads_and_falls_back_to_2048_with_a_warning(export, tmp_path):
    old = tmp_path / "old_export"
    shutil.copytree(export, old)
    config = json.loads((old / "config.json").read_text())
    del config["train_seq_length"]
    (old / "config.json").write_text(json.dumps(config))
    from megatron_loop.eval.sweep import SweepSettings, resolve_seq_length

    settings = SweepSettings(loops=[1], valid_prefix=data_assets().prefix + "_valid")
    (line,) = resolve_seq_length(settings, old, config)
    assert settings.seq_length == 2048 and line.startswith(f"warning: {old / 'config.json'} has no train_seq_length")
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(old, trust_remote_code=True).config.train_loops == 3


def test_output_that_is_a_file_or_another_sweep_is_refused_before_any_work(export, tmp_path):
    valid = ["--valid-prefix", data_assets().prefix + "_valid"]
    afile = tmp_path / "results_file"
    afile.write_text("mine")
    code, _, err = _run(["--model", str(export), "--loops", "1", *valid, "--output", str(afile), *VALID])
    assert code == 2 and err.splitlines() == [
        f"error: --output {afile}: exists and is not a folder; expected a folder for results.json, the CSV tables "
        "and the plots"]
    assert afile.read_text() == "mine"

    out = tmp_path / "sweep"
    assert _run(["--model", str(export), "--loops", "1", *valid, "--output", str(out), *VALID])[0] == 0
    before = (out / "results.json").read_bytes()
    code, _, err = _run(["--model", str(export), "--loops", "1", *valid, "--output", str(out),
                         "--valid-sequences", "2", *VALID[:2], "--no-progress"])
    assert code == 2 and err.splitlines() == [
        f"error: --output {out}: results.json there holds another sweep (different valid_sequences); pass "
        "--overwrite to replace it, or choose another --output"]
    assert (out / "results.json").read_bytes() == before  # nothing lost
    code, _, err = _run(["--model", str(export), "--loops", "1", *valid, "--output", str(out), "--overwrite",
                         "--valid-sequences", "2", *VALID[:2], "--no-progress"])
    assert code == 0 and json.loads((out / "results.json").read_text())["sweep_settings"]["valid_sequences"] == 2


def test_each_r_is_written_as_it_completes_and_an_interrupted_sweep_resumes(export, tmp_path, monkeypatch):
    from megatron_loop.eval import heldout

    # one pass per r (this model's trajectory does not depend on r, so by default one forward serves all r)
    valid = ["--valid-prefix", data_assets().prefix + "_valid", "--per-r"]
    out = tmp_path / "sweep"
    calls = []
    real = heldout.heldout_loss

    def interrupted_at_r3(model, *args, **kwargs):
        calls.append(model.config.num_loops)
        if model.config.num_loops == 3:
            raise KeyboardInterrupt  # Ctrl-C (or a kill) in the middle of r = 3
        return real(model, *args, **kwargs)

    monkeypatch.setattr(heldout, "heldout_loss", interrupted_at_r3)
    code, _, err = _run(["--model", str(export), "--loops", "1,2,3", *valid, "--output", str(out), *VALID])
    assert (code, err.splitlines()[-1]) == (130, INTERRUPTED)  # Ctrl-C: one line, exit 130 (cli.run_cli)
    staged = tmp_path / "sweep.partial"  # the sweep in progress; --output appears only when it is done
    partial = json.loads((staged / "results.json").read_text())
    assert partial["loops"] == [1, 2] and sorted(partial["heldout"]) == ["1", "2"]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["sweep.partial"]
    assert [p.name for p in staged.iterdir()] == ["results.json"]  # written through a temporary file and a rename

    monkeypatch.setattr(heldout, "heldout_loss", real)
    counted = []
    monkeypatch.setattr(heldout, "heldout_loss", lambda model, *a, **k: counted.append(model.config.num_loops)
                        or real(model, *a, **k))
    code, printed, err = _run(["--model", str(export), "--loops", "1,2,3,4", *valid, "--output", str(out), *VALID])
    assert code == 0 and counted == [3, 4], err  # r = 1, 2 are not evaluated again
    assert f"resuming the sweep in {staged / 'results.json'}: r = 1, 2 already done" in err
    assert not staged.exists()  # published: swapped in for --output
    final = json.loads((out / "results.json").read_text())
    assert final["loops"] == [1, 2, 3, 4]
    assert final["heldout"]["1"] == partial["heldout"]["1"] and final["heldout"]["2"] == partial["heldout"]["2"]
    assert (out / "results.csv").is_file() and "r=4 (L=8)" in printed

    counted.clear()  # a finished sweep run again: nothing evaluated, the model not even loaded
    assert _run(["--model", str(export), "--loops", "1,2", *valid, "--output", str(out), *VALID])[0] == 0
    assert counted == [] and json.loads((out / "results.json").read_text())["loops"] == [1, 2, 3, 4]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_device_cuda_without_cuda_is_one_line(export, tmp_path):
    code, _, err = _run(["--model", str(export), "--loops", "1", "--valid-prefix", data_assets().prefix + "_valid",
                         "--device", "cuda", "--output", str(tmp_path / "out"), *VALID])
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: --device cuda: CUDA is not available on this machine (torch ")
    assert err.rstrip().endswith("expected --device cpu, or no --device (cuda when available)")
    assert not (tmp_path / "out").exists()


def test_hub_tasks_without_network_fail_fast_naming_them(export, tmp_path):
    """Offline mode off, no hub (a closed port stands for a machine without network): one probe, then the
    paper's eleven tasks fail in seconds (before: about 30 s of retries per task), nothing written."""
    env = {k: v for k, v in offline_env().items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "empty_hf_home"),
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    start = time.monotonic()
    r = subprocess.run([sys.executable, str(REPO / "tools" / "eval_loops.py"), "--model", str(export), "--loops", "1",
                        "--output", str(tmp_path / "out"), "--no-progress"], env=env, capture_output=True, text=True,
                       timeout=300)
    elapsed = time.monotonic() - start
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith(
        "error: --tasks: sciq, arc_easy, piqa, arc_challenge, winogrande, openbookqa, hellaswag, commonsense_qa, "
        "proofwriter, clutrr, bbh need datasets from the Hugging Face hub that are not in the local cache, and the hub "
        "is unreachable (http://127.0.0.1:9: "), errors[0]
    assert "or evaluate local tasks (--tasks facts,clutrr=looplm_clutrr_local" in errors[0]
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
    assert elapsed < 120, elapsed  # task indexing and imports; no per-task network retries


def test_outputs_are_published_as_one_set_and_a_killed_overwrite_keeps_the_old_set(export, tmp_path, monkeypatch):
    """The finished sweep's results.json, CSV tables and figures replace --output together (a folder swap);
    a sweep killed meanwhile, even with --overwrite, leaves the previous set whole and its own results in
    OUTPUT.partial (resumed by the same call; a write killed half-way there is never published); a folder
    holding files a sweep does not write is refused before any work."""
    from megatron_loop.eval import heldout

    valid = ["--valid-prefix", data_assets().prefix + "_valid", "--per-r"]
    out = tmp_path / "sweep"
    assert _run(["--model", str(export), "--loops", "1,2", *valid, "--output", str(out), *VALID])[0] == 0
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"results.json", "results.csv", "per_depth.csv", "loss_vs_loops.png"} <= set(old)

    real = heldout.heldout_loss

    def killed_at_r2(model, *args, **kwargs):
        if model.config.num_loops == 2:
            raise KeyboardInterrupt
        return real(model, *args, **kwargs)

    monkeypatch.setattr(heldout, "heldout_loss", killed_at_r2)
    other = ["--valid-sequences", "2", *VALID[:2], "--no-progress"]
    code, _, err = _run(["--model", str(export), "--loops", "1,2", *valid, "--output", str(out), "--overwrite",
                         *other])
    assert (code, err.splitlines()[-1]) == (130, INTERRUPTED)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old  # the previous set, whole and alone
    staged = tmp_path / "sweep.partial"
    assert json.loads((staged / "results.json").read_text())["loops"] == [1]
    (staged / ".results.json.tmp-1-abcdef.json").write_text("{")  # as a write killed half-way leaves it

    monkeypatch.setattr(heldout, "heldout_loss", real)
    code, _, err = _run(["--model", str(export), "--loops", "1,2", *valid, "--output", str(out), *other])
    assert code == 0 and f"resuming the sweep in {staged / 'results.json'}: r = 1 already done" in err
    assert "loop sweep: one pass per r for r = 2 (--per-r)" in err.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]  # no partial, no hidden leftover
    assert set(p.name for p in out.iterdir()) == set(old)
    assert json.loads((out / "results.json").read_text())["sweep_settings"]["valid_sequences"] == 2

    (out / "notes.txt").write_text("mine")
    code, _, err = _run(["--model", str(export), "--loops", "1", *valid, "--output", str(out), "--overwrite", *VALID])
    assert code == 2 and err.splitlines() == [
        f"error: --output {out}: holds notes.txt, which a loop sweep does not write (it replaces the folder whole "
        "when it finishes); expected a sweep's folder or a new one: choose another --output"]
    assert (out / "notes.txt").read_text() == "mine"


def test_compare_prints_a_table_of_differences_and_runs_are_named_as_training_named_them(export, tmp_path):
    """The export records the run's name as training stated it; the sweep's default label is that name (not the
    export folder's, ``hf``), and ``--compare`` prints this sweep minus the other on the console."""
    from megatron_loop.eval.plots import model_label

    name = json.loads((export / "config.json").read_text())["run_name"]
    assert name and name != "hf"
    first = ["--model", str(export), "--loops", "1,3", "--valid-prefix", data_assets().prefix + "_valid", *VALID]
    code, _, err = _run([*first, "--output", str(tmp_path / "a")])
    assert code == 0, err
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results["label"] == name and model_label(results).startswith(f"{name} (0+2x3+0")
    code, out, err = _run([*first, "--output", str(tmp_path / "b"), "--label", "again", "--compare",
                           str(tmp_path / "a" / "results.json")])
    assert code == 0, err
    table = out[out.index("differences: again (0+2x3+0"):]
    assert f" minus {model_label(results)} (points; loss in nats)" in table.splitlines()[0]
    row = next(line for line in table.splitlines() if line.startswith("| heldout_loss"))
    cells = [c.strip() for c in row.split("|")[4:-1]]
    assert len(cells) == 2 and all(c.startswith("+0.00 ± ") for c in cells), cells  # the same model: no difference
