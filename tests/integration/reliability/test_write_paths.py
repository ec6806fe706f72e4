"""The write paths outside a training step (docs/RELIABILITY.md rows 59-61): preprocessing, the universal
conversion of a resume on another number of ranks. A full disk (here: the process file-size limit,
which fails the write the same way, EFBIG instead of ENOSPC) or Ctrl-C ends the command within a
bound with one ``error:`` line naming the real file and cause, exit 2 (130 for Ctrl-C), no
traceback, and no temporary file left on the disk that filled up."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from data_fixtures import data_assets
from train_fixtures import FAULTS, REPO, command, env, records, reference_run

BOUND_S = 120


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


def _preprocess_args(out_prefix, *extra):
    assets = data_assets()
    return ["preprocess_data.py", "--input", str(assets.corpus / "train.jsonl"), "--tokenizer", str(assets.tokenizer),
            "--output-prefix", str(out_prefix), "--validation-documents", "20", "--no-progress", *extra]


def test_preprocessing_on_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path):
    """Before: two raw OSError tracebacks, and corpus.tmpPID.bin / corpus_valid.tmpPID.bin left on the
    full disk (the flush failed again in discard() and the unlink was skipped)."""
    prefix = tmp_path / "data" / "corpus"
    start = time.monotonic()
    result = subprocess.run(command("fsize@30000", *_preprocess_args(prefix, "--workers", "2"), script=str(FAULTS)),
                            cwd=REPO, env=env(), capture_output=True, text=True, timeout=BOUND_S)
    assert time.monotonic() - start < BOUND_S
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = _errors(result.stderr)
    assert line.startswith(f"error: --output-prefix {prefix}: writing the indexed dataset failed (file too large (the "
                           "process file-size limit, ulimit -f) (EFBIG)"), line
    assert line.endswith("); nothing was published and its temporary files are removed"), line
    assert sorted(p.name for p in prefix.parent.iterdir()) == []  # no P.tmpPID.bin, nothing published


@pytest.mark.timeout(300)
def test_ctrl_c_during_preprocessing_is_one_line_exit_130(tmp_path):
    """SIGINT to the whole foreground process group (Ctrl-C) while two encoding workers run: one line,
    exit 130, no KeyboardInterrupt traceback from the parent or the pool's workers, no temporary file."""
    prefix = tmp_path / "data" / "corpus"
    proc = subprocess.Popen(command("slow_encode@0.5", *_preprocess_args(prefix, "--workers", "2", "--batch-size", "8"),
                                    script=str(FAULTS)),
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + BOUND_S
    while not list(prefix.parent.glob("corpus.tmp*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)  # a few batches into the encoding
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert _errors(err) == ["error: interrupted (SIGINT): stopped; outputs are published only when complete, so "
                            "nothing half-written is left"], err[-3000:]
    assert sorted(p.name for p in prefix.parent.iterdir()) == []


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_full_disk_during_the_universal_conversion_is_one_line_and_a_restart_resumes(tmp_path):
    """A 1-rank checkpoint resumed on 2 ranks (torchrun --max-restarts 1): the disk fills while rank 0
    writes the universal copy. Before: rc 1, a traceback per rank (torch's ``enforce fail``), no
    ``error:`` line, and ``global_step10.universal.partial`` kept the disk full until the next start.
    Now one line naming the folder and the condition, the partial copy removed at once, ``latest``
    kept; torchrun's restart (the fault is injected in the first attempt only) converts again and
    trains to the end."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference_run().run_dir, run)
    ckpt = run / "checkpoints"
    latest = (ckpt / "latest").read_text()
    args = ["--config", str(reference_run().config), "--set", f"train.output_dir={run}", "--set", "train.max_steps=12",
            "--set", "train.eval_interval=0"]
    cmd = command("universal_full@3", *args, nproc=2, launcher="torchrun", script=str(FAULTS))
    cmd[1:1] = ["--max-restarts", "1"]
    start = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, env=dict(env(), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10"), capture_output=True,
                            text=True, timeout=540)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    first = [line for line in _errors(out) if "universal" in line]
    assert len(first) == 1, out[-6000:]
    partial = ckpt / f"{latest}.universal.partial"
    assert first[0].startswith(f"error: {partial}: writing the universal checkpoint failed (no space left on device "
                               "(ENOSPC)"), first[0]
    assert first[0].endswith(f"; removed it, {ckpt / latest} is unchanged"), first[0]
    assert "Traceback" not in out.split(first[0])[0][-3000:]  # the failed attempt: the line, no traceback
    assert (ckpt / "latest").read_text() == "global_step12"  # the restart resumed and trained to the end
    assert [r["step"] for r in records(run, "train")][-2:] == [11, 12]
    assert not list(ckpt.glob("*.partial")) and time.monotonic() - start < 540
