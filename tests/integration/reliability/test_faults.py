"""The fault suite: stops, crashes, locks and disk errors of real runs (docs/RELIABILITY.md lists every scenario with its test).

Real runs (CPU, gloo, the tiny config of ``train_fixtures``) under python, torchrun and the
``deepspeed`` launcher, stopped the way a cluster stops them; each asserts the outcome: a
checkpoint written and the run continuing as the uninterrupted reference run, or one clear
error and nothing lost. Runs are slowed (``faults.py slow@...``) so that a signal lands mid-run.

The launcher scenarios form one chain over one run folder (every launch costs seconds of
imports, so each stage is also the next stage's resume): python with DataLoader workers and
a group SIGTERM; torchrun on 2 ranks from that 1-rank checkpoint (universal checkpoint, 1 -> 2)
with a NaN stop; torchrun with a group SIGTERM; torchrun dying of SIGUSR1 (not forwarded);
the ``deepspeed`` runner dying of SIGTERM (not forwarded); python on 1 rank again (2 -> 1) to
the end. The loss of every step matches the reference run within fp32 tolerance (the data-
parallel size changes the reduction order only); a lost Muon momentum would be 10x off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from train_fixtures import (FAULTS, REPO, check_ok, command, copy_run, env, losses, records, reference_run,
                            run_cli, start_cli, wait_for_step)

pytestmark = pytest.mark.slow

# fp32 loss differences from another data-parallel size (reduction order) stay below 1e-4 over
# ten steps; dropping Muon's momentum at a change of size moves the next loss by > 2e-3.
TOL = 3e-4


def _common(run_dir, *overrides):
    args = ["--config", str(reference_run().config), "--set", f"train.output_dir={run_dir}"]
    for o in ("train.eval_interval=0", *overrides):
        args += ["--set", o]
    return args


def _latest(run_dir):
    return (run_dir / "checkpoints" / "latest").read_text()


def _manifest(run_dir, tag):
    return json.loads((run_dir / "checkpoints" / tag / "manifest.json").read_text())


def _stop(run_dir):
    stop = records(run_dir, "stop")[-1]
    assert _latest(run_dir) == f"global_step{stop['step']}", "the stop did not publish its checkpoint"
    return stop


def _resumes(run_dir):
    """Resume records so far (None: a new folder)."""
    return len(records(run_dir, "resume")) if (run_dir / "metrics.jsonl").is_file() else None


def _wait_trained(proc, run_dir, resumes_before, timeout=420):
    """Until this launch trained a step: after its own resume record (the folder held
    ``resumes_before`` of them), or in a new folder (None); records of earlier launches do not count."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early (exit {proc.returncode}):\n{proc.stdout.read()[-4000:]}")
        try:
            recs = records(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        except json.JSONDecodeError:  # a line being written
            recs = []
        resumes = [i for i, r in enumerate(recs) if r["event"] == "resume"]
        since = 0 if resumes_before is None else resumes[-1] if len(resumes) > resumes_before else None
        if since is not None and any(r["event"] == "train" for r in recs[since:]):
            return
        time.sleep(0.05)
    raise AssertionError(f"no training step within {timeout} s")


def _interrupted(run_dir, deliver, launcher, workers=1):
    """One slowed launch on 2 ranks (1 under python) in ``run_dir``: once it trained a step,
    ``deliver(proc)`` (a signal); then wait for every process of it. Returns (proc, output, the
    stop record, whose checkpoint must be the published ``latest``)."""
    before = _resumes(run_dir)
    proc = start_cli("slow@0.2", *_common(run_dir, f"data.num_workers={workers}"), script=str(FAULTS),
                     nproc=1 if launcher == "python" else 2, launcher=launcher, new_session=True)
    _wait_trained(proc, run_dir, before)
    deliver(proc)
    out = _finish(proc)
    assert "killed by signal" not in out, out[-4000:]  # no DataLoader worker died of a group signal
    return proc, out, _stop(run_dir)


def _finish(proc, timeout=300):
    """Wait for a launch and every process under it (ranks outlive a launcher that died)."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    out, _ = proc.communicate(timeout=timeout)  # EOF once every holder of the pipe (ranks too) exited
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive, f"orphan processes left: {alive}\n{out[-4000:]}"
    return out


@pytest.mark.distributed
def test_signals_through_every_launcher_and_data_parallel_changes(tmp_path):
    ref = reference_run()
    run_dir = tmp_path / "run"

    # python, 2 DataLoader workers, SIGTERM to the whole process group (scancel, systemd)
    proc, out, first = _interrupted(run_dir, lambda p: os.killpg(p.pid, signal.SIGTERM), "python", 2)
    assert proc.returncode == 0 and first["reason"] == "SIGTERM", out[-4000:]

    # torchrun, 2 ranks from the 1-rank checkpoint (universal), NaN loss with nan_policy=stop:
    # the ranks exit 3 (torchrun itself always exits 1 when a rank fails) with the last good state
    nan = run_cli("nan@2:1", *_common(run_dir, "data.num_workers=1", "train.nan_policy=stop"), nproc=2,
                  launcher="torchrun", script=str(FAULTS))
    text = nan.stdout + nan.stderr
    assert "resume: 1 -> 2 data-parallel ranks" in text, text[-4000:]
    assert re.search(r"exitcode\W+3\b", text) and "train.nan_policy=stop" in text, text[-4000:]
    assert [r["step"] for r in records(run_dir, "nonfinite")] == [first["step"] + 1]
    assert _latest(run_dir) == f"global_step{first['step']}"
    assert _manifest(run_dir, _latest(run_dir))["world_size"] == 2

    # torchrun, SIGTERM to its process group: torchrun forwards it to each rank's group, the
    # DataLoader workers there ignore it, the ranks save
    proc, out, second = _interrupted(run_dir, lambda p: os.killpg(p.pid, signal.SIGTERM), "torchrun")
    assert second["reason"] == "SIGTERM" and second["step"] > first["step"], out[-4000:]

    # torchrun dies of SIGUSR1 (not in its --signals-to-handle): the ranks notice and save
    proc, out, third = _interrupted(run_dir, lambda p: p.send_signal(signal.SIGUSR1), "torchrun")
    assert proc.returncode == -signal.SIGUSR1
    assert third["reason"] == "launcher exited" and third["step"] > second["step"], out[-4000:]

    # the deepspeed runner dies of SIGTERM (it does not forward it; launch.py below it lives on)
    proc, out, fourth = _interrupted(run_dir, lambda p: p.send_signal(signal.SIGTERM), "deepspeed")
    assert proc.returncode == -signal.SIGTERM
    assert fourth["reason"] == "launcher exited" and fourth["step"] > third["step"], out[-4000:]

    # python, 1 rank again (universal, 2 -> 1), to the end
    last = run_cli(*_common(run_dir))
    check_ok(last)
    assert "resume: 2 -> 1 data-parallel ranks" in last.stderr

    got, want = losses(run_dir), losses(ref.run_dir)
    assert sorted(got) == list(range(1, 11))  # every step once: replayed steps replaced
    far = {s: (got[s], want[s]) for s in want if abs(got[s] - want[s]) > TOL}
    assert not far, f"loss differs from the uninterrupted run beyond {TOL}: {far}"
    assert [r["reason"] for r in records(run_dir, "stop")] == ["SIGTERM", "SIGTERM", "launcher exited",
                                                               "launcher exited"]


def test_rollback_starts_a_branch_and_changed_settings_apply(tmp_path):
    """``--resume global_step9`` in a folder that has step 10, with ``train.lr`` and
    ``train.max_steps`` changed: step 10 and its metrics move aside, the schedule is the new one
    from the next update on (not the old floor), ``latest`` follows the branch."""
    from megatron_loop.optim.schedule import wsd_lambda, wsd_split

    ref = reference_run()
    run_dir = copy_run(ref.run_dir, tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    old_step10 = [r for r in records(run_dir) if r.get("step") == 10]
    # global_step9 is in the old decay: rewarm (by name) runs the new schedule's rate from the next update;
    # the default, continue_decay, would decay on from the checkpoint's rate (tests/unit/training/test_resume.py)
    result = run_cli(*_common(run_dir, "train.max_steps=12", "train.lr=0.001", "train.schedule_on_resume=rewarm"),
                     "--resume", str(ckpt / "global_step9"))
    check_ok(result)
    assert "train.lr 0.003 -> 0.001; train.max_steps 10 -> 12" in result.stderr
    (aside,) = (ckpt / "set_aside").iterdir()
    assert f"newer checkpoints and their metrics moved to {aside}" in result.stderr
    assert sorted(p.name for p in aside.iterdir()) == ["global_step10", "metrics.jsonl"]
    assert [json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines()] == old_step10

    got, want = losses(run_dir), losses(ref.run_dir)
    assert sorted(got) == list(range(1, 13)) and all(got[s] == want[s] for s in range(1, 10))
    split = wsd_split(12)
    for r in records(run_dir, "train"):
        if r["step"] >= 10:  # update t runs at peak * lambda(t) of the 12-step schedule
            assert r["lr_muon"] == pytest.approx(0.001 * wsd_lambda(r["step"], *split), rel=1e-12)
    assert _latest(run_dir) == "global_step12"
    assert sorted(p.name for p in ckpt.glob("global_step*")) == ["global_step12", "global_step9"]


def test_output_folder_vanishing_mid_run_stops_with_an_error(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_cli("slow@0.2", *_common(run_dir, "train.save_interval=100"), script=str(FAULTS))
    wait_for_step(proc, run_dir, 1)
    shutil.rmtree(run_dir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-4000:]
    (line,) = [x for x in out.splitlines() if x.startswith("error: ")]
    assert re.search(rf"train\.output_dir='{re.escape(str(run_dir))}': output folder vanished during the run "
                     r"\(deleted, moved or unmounted\) after step \d+; stopped without saving", line), line
    assert not run_dir.exists()  # nothing recreated behind the operator's back


@pytest.mark.distributed
@pytest.mark.parametrize("stall, parallel", [
    ("stall@1:3", ()),  # data parallel: DeepSpeed's gradient all-reduce
    # TP = 2 + SP: one of megatron-core's tensor-parallel collectives, whose groups get the timeout from
    # parallel/bootstrap.py (before: gloo's and NCCL's 30-minute default; no error after 300 s)
    ("stall@1:5", ("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true")),
], ids=["data_parallel", "tensor_parallel"])
def test_stopped_rank_makes_the_others_fail_within_the_collective_timeout(tmp_path, stall, parallel):
    """Rank 1 is stopped (SIGSTOP, not killed) in its second step: rank 0 gives one clear error
    after train.collective_timeout_s instead of waiting the backend's default 30 minutes. (The
    timeout also bounds the start-up rendezvous, hence 15 s: on a loaded machine one rank may
    finish its imports seconds after the other.)"""
    run_dir = tmp_path / "run"
    cmd = command(stall, *_common(run_dir, "train.collective_timeout_s=15", *parallel), nproc=2, launcher="torchrun",
                  script=str(FAULTS))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(env(), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = _finish(proc)
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    assert errors == ["error: a collective operation did not complete within train.collective_timeout_s=15 s: "
                      "another rank stopped, hung or died (after step 1; the latest checkpoint is none)"], out[-4000:]
    assert re.search(r"exitcode\W+1\b", out) and time.monotonic() - start < 240


@pytest.mark.timeout(400)
def test_data_and_tokenizer_replaced_in_place_are_caught(tmp_path):
    """Same names and sizes, other content: the training data reversed in place is refused at
    resume (sampled-block + index hash); the tokenizer folder retrained in place is refused at
    resume and at export (its files' hash, recorded in the checkpoint manifest; before, a resume
    recorded the new hash and the export then passed)."""
    import numpy as np

    from data_fixtures import data_assets
    from megatron_loop.data.tokenizer import train_bpe_tokenizer

    assets = data_assets()
    data = tmp_path / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(assets.prefix + ext, data / f"train{ext}")
    tok = shutil.copytree(assets.tokenizer, tmp_path / "tokenizer")
    run_dir = tmp_path / "run"
    args = _common(run_dir, f"data.train_prefixes=[{data / 'train'}]", f"data.tokenizer={tok}",
                   "data.valid_prefixes=[]", "train.max_steps=2", "train.save_interval=2")
    check_ok(run_cli(*args))

    bin_file = data / "train.bin"
    tokens = np.fromfile(bin_file, dtype=np.uint16)
    original = bin_file.read_bytes()
    tokens[::-1].tofile(bin_file)  # same size, tokens reversed
    resumed = run_cli(*args, "--set", "train.max_steps=4")
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    line = resumed.stderr.splitlines()[-1]
    assert re.fullmatch(rf"error: {re.escape(str(run_dir))}/checkpoints/global_step2/manifest\.json: "
                        rf"{re.escape(str(data / 'train'))}\.bin/\.idx: same name and size \({len(original)} bytes\) "
                        r"but other content than the checkpoint trained on \(sha256 of the index and sampled blocks: "
                        r"[0-9a-f]{12} then, [0-9a-f]{12} now\); .*", line), line
    bin_file.write_bytes(original)

    train_bpe_tokenizer(assets.documents[:50], tok, vocab_size=300)  # retrained in place
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    resumed = run_cli(*args, "--set", "train.max_steps=4")  # refused: the next save would record the new hash
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert re.fullmatch(rf"error: {re.escape(str(run_dir))}/checkpoints/global_step2/manifest\.json: data\.tokenizer="
                        rf"'{re.escape(str(tok))}': other files than the tokenizer the checkpoint trained with \(sha256 "
                        r"of its files: [0-9a-f]{12} then \(.*\), [0-9a-f]{12} now\); .*", resumed.stderr.splitlines()[-1])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    export = run_cli("--checkpoint", str(run_dir / "checkpoints"), "--output", str(tmp_path / "hf"),
                     script="tools/convert_to_hf.py")
    assert export.returncode == 2, export.stderr[-3000:]
    assert re.fullmatch(rf"error: {re.escape(str(tok))}: not the tokenizer the model was trained with: the sha256 of "
                        r"its files is [0-9a-f]{12}, .*global_step2/manifest\.json records [0-9a-f]{12} .*; pass "
                        r"--tokenizer with the tokenizer of training", export.stderr.splitlines()[-1])
    assert not (tmp_path / "hf").exists()


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_sigint_to_the_deepspeed_group_and_sighup_to_torchrun_checkpoint(tmp_path):
    """SIGINT to the whole ``deepspeed`` launcher group (Ctrl-C in its terminal): launch.py also
    SIGTERMs the ranks; the ranks stop after the step with a checkpoint (under plain python
    Ctrl-C stays an immediate stop, exit 130). SIGHUP to torchrun (its ssh session dropped):
    torchrun forwards it and the ranks checkpoint instead of dying of it."""
    run_dir = tmp_path / "run"
    proc, out, first = _interrupted(run_dir, lambda p: os.killpg(p.pid, signal.SIGINT), "deepspeed")
    assert first["reason"] in ("SIGINT", "SIGTERM"), out[-4000:]
    assert "stopped without saving" not in out, out[-4000:]

    proc, out, second = _interrupted(run_dir, lambda p: p.send_signal(signal.SIGHUP), "torchrun")
    assert second["reason"] == "SIGHUP" and second["step"] > first["step"], out[-4000:]
