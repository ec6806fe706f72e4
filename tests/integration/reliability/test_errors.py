"""An error ends the run (docs/RELIABILITY.md, "Errors end the run").

Real runs (CPU, the tiny config, DataLoader workers on as shipped) hit an error mid-run: a plain
exception in a step, a full disk under ``metrics.jsonl``, a DataLoader worker stopped (hung) or
killed as the out-of-memory killer kills; under torchrun an exception on one rank. Each must end
every process of the run (workers included) with a non-zero exit within a bound, print the real
error once and leave nothing behind (no process, the lock released, checkpoints kept).
"""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from train_fixtures import FAULTS, REPO, command, env, records, reference_run

pytestmark = pytest.mark.slow

# Start-up (imports, DeepSpeed) takes 5-20 s on a loaded 2-core machine; a run that does not exit
# after an error never ends, so any bound far above the start-up proves the point.
BOUND_S = 120


def _args(run_dir, *overrides):
    args = ["--config", str(reference_run().config), "--set", f"train.output_dir={run_dir}",
            "--set", "train.eval_interval=0", "--set", "data.num_workers=1"]
    for o in overrides:
        args += ["--set", o]
    return args


def _run_to_end(fault, run_dir, *overrides, nproc=1, launcher="python"):
    """Launch with ``fault``; every process of the launch must be gone within BOUND_S.
    Returns (exit code, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(command(fault, *_args(run_dir, *overrides), nproc=nproc, launcher=launcher,
                                    script=str(FAULTS)),
                            cwd=REPO, env=dict(env(), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    tree: set[psutil.Process] = set()
    deadline = start + BOUND_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:  # remember every process of the launch (the workers too) to check none outlives it
            tree.update(psutil.Process(proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    hung = proc.poll() is None
    if hung:
        for p in [*tree, psutil.Process(proc.pid)]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    out, _ = proc.communicate(timeout=60)
    assert not hung, f"the run did not exit within {BOUND_S} s after the fault:\n{out[-4000:]}"
    _, alive = psutil.wait_procs(list(tree), timeout=10)
    assert not alive, f"processes outlived the run: {alive}\n{out[-4000:]}"
    return proc.returncode, out, time.monotonic() - start


def _errors(out):
    return [line for line in out.splitlines() if line.startswith("error: ")]


def _released(run_dir):
    return (run_dir / "run.lock").read_text() == ""


@pytest.mark.timeout(300)
def test_exception_in_a_step_with_a_worker_alive_exits_with_the_error_once(tmp_path):
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("raise@9", run_dir)  # forward 9 = step 3 (4 micro-batches a step)
    assert code == 1, out[-4000:]
    assert out.count("RuntimeError: injected fault in training forward 9") == 1, out[-4000:]
    assert "During handling of the above exception" not in out, out[-4000:]  # no second error masks it
    assert _released(run_dir)


@pytest.mark.timeout(300)
def test_disk_full_under_metrics_is_one_error_line(tmp_path):
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("metrics@full:3", run_dir, "train.save_interval=2")
    assert code == 2, out[-4000:]
    assert _errors(out) == [f"error: {run_dir / 'metrics.jsonl'}: no space left on device (ENOSPC) (after step 4; "
                            "the latest checkpoint is global_step2)"], out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step2" and _released(run_dir)


@pytest.mark.timeout(300)
def test_stopped_worker_is_an_error_after_the_worker_timeout(tmp_path):
    """A worker stopped (SIGSTOP) as it reads sample 30 (step 4): without the timeout the main
    process blocks forever, also on SIGTERM (the batch's tensors arrive from the stopped worker)."""
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("worker@STOP:30", run_dir, "data.worker_timeout_s=2")
    assert code == 1, out[-4000:]
    assert _errors(out) == ["error: data.worker_timeout_s=2: no batch from the DataLoader workers "
                            "(data.num_workers=1) within 2 s: a worker hung or was stopped (after step 3; the "
                            "latest checkpoint is global_step3)"], out[-4000:]
    assert _released(run_dir)


@pytest.mark.timeout(300)
def test_worker_killed_as_by_the_oom_killer_is_one_error_line(tmp_path):
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("worker@KILL:30", run_dir)
    assert code == 1, out[-4000:]
    (line,) = _errors(out)
    assert line.startswith("error: data.num_workers=1: DataLoader worker (pid ") and (
        "was killed by signal SIGKILL (Killed; the kernel's out-of-memory killer sends it: see dmesg)" in line
        and line.endswith("(after step 3; the latest checkpoint is global_step3)")), out[-4000:]
    assert "Traceback" not in out, out[-4000:]


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_exception_on_one_rank_ends_every_process_of_a_torchrun_launch(tmp_path):
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("raise@1:5", run_dir, nproc=2, launcher="torchrun")
    assert code != 0, out[-4000:]
    assert out.count("RuntimeError: injected fault in training forward 5") == 1, out[-4000:]
    assert not records(run_dir, "summary") and _released(run_dir)


@pytest.mark.timeout(300)
def test_metrics_file_removed_mid_run_is_recreated_and_reported(tmp_path):
    """``rm metrics.jsonl`` under a running run: appends would go to the unlinked file and the
    run would end with rc 0 and no metrics. The logger notices at the next record, recreates the
    file, says so, and the summary records it."""
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("metrics@remove:3", run_dir)
    assert code == 0, out[-4000:]
    # removed after the train record of step 3; the next record is step 3's checkpoint
    assert f"warning: {run_dir / 'metrics.jsonl'} was removed during the run; recreated at step 3" in out
    recs = records(run_dir)
    assert recs[:2] == [{"event": "metrics_recreated", "step": 3},
                        {"event": "checkpoint", "step": 3, "tag": "global_step3",
                         "path": str(run_dir / "checkpoints" / "global_step3")}]
    assert [r["step"] for r in recs if r["event"] == "train"] == list(range(4, 11))
    assert records(run_dir, "summary")[0]["metrics_recreated_at"] == 3


def test_a_worker_killed_during_the_descriptor_handshake_is_named_not_a_broken_connection():
    """The kill can land while the main process fetches a batch's tensors from the worker: the
    socket breaks (ECONNRESET) before torch's SIGCHLD check names the worker. The same one line
    as above, from the worker's exit code, not an I/O error of the run folder."""
    import torch
    from types import SimpleNamespace

    from megatron_loop.data.loaders import LoaderFailure, SupervisedBatches

    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=1)
    batches = SupervisedBatches(loader, timeout_s=30)

    class Broken:
        _workers = [SimpleNamespace(pid=4242, exitcode=-9)]

        def __next__(self):
            raise ConnectionResetError(104, "Connection reset by peer")

    batches._batches = Broken()
    with pytest.raises(LoaderFailure, match=r"DataLoader worker \(pid 4242\) was killed by signal SIGKILL"):
        next(batches)
    Broken._workers = [SimpleNamespace(pid=4242, exitcode=None)]  # no worker died (after a 2 s grace): unchanged
    with pytest.raises(ConnectionResetError):
        next(batches)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 1])
def test_data_truncated_under_a_live_run_is_one_line_naming_the_file(tmp_path, workers):
    """RELIABILITY.md row 67. ``P.bin`` truncated in place after step 3 (``cp`` over it, preprocessing
    run again into the prefix in place). Before: with workers "killed by signal Bus error ... out of
    shared memory ... give the job more memory"; in-process (``num_workers: 0``) exit 135 and no
    message at all (a SIGBUS from the memory map). Now the change is caught before the next batch is
    read (or, when a worker's prefetch hit it first, from the worker's SIGBUS): one line naming the
    file and both sizes, exit 2; the checkpoints are kept."""
    from data_fixtures import copy_prefix

    run_dir = tmp_path / "run"
    prefix = copy_prefix(tmp_path)
    size = (tmp_path / "p.bin").stat().st_size
    code, out, _ = _run_to_end("data@truncate:3", run_dir, f"data.num_workers={workers}",
                               f"data.train_prefixes=[{prefix}]", "train.save_interval=2")
    assert code == 2, out[-4000:]
    assert _errors(out) == [f"error: {prefix}.bin: {size // 2} bytes now, {size} when the run opened it: the data "
                            "file changed in place during the run (truncated or rewritten, e.g. copied over or "
                            "preprocessed again into the same prefix), so its memory map would read past the new end "
                            "(SIGBUS); restore the file, or write new data under a new prefix and start a new run"], \
        out[-4000:]
    assert "Traceback" not in out and "shared memory" not in out, out[-4000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == "global_step2" and _released(run_dir)


@pytest.mark.timeout(300)
def test_a_full_shared_memory_is_named_as_such_not_the_output_folder(tmp_path):
    """RELIABILITY.md row 68. Before: "OUTPUT_DIR: no space left on device" (any OSError without a file
    name was blamed on train.output_dir) and an AttributeError from the DataLoader's half-built
    iterator. Now one line naming /dev/shm and what to do, before the model is built."""
    run_dir = tmp_path / "run"
    code, out, _ = _run_to_end("shm_full", run_dir)
    assert code == 2, out[-4000:]
    (line,) = _errors(out)
    assert line.startswith("error: data.num_workers=1: shared memory (/dev/shm) is full (0.0 MiB free of 64 MiB, "
                           "about "), line
    assert line.endswith("MiB needed): the DataLoader workers pass their batches through /dev/shm; give the job more "
                         "shared memory (docker run --shm-size, a larger /dev/shm) or set data.num_workers: 0"), line
    assert "Traceback" not in out and "AttributeError" not in out and str(run_dir) not in line, out[-4000:]
    assert not run_dir.exists()  # refused before anything was written: the folder the lock made is gone too


@pytest.mark.parametrize("code, cause", [
    (-7, "SIGBUS (Bus error: a memory-mapped file shrank under it, or shared memory ran out)"),
    (-11, "SIGSEGV"),
])
def test_a_worker_killed_by_another_signal_gets_no_memory_hint(code, cause, monkeypatch):
    """Only the out-of-memory killer's SIGKILL gets the memory hint, and a full /dev/shm its own
    line; a SIGBUS with /dev/shm not full and the data unchanged, or a SIGSEGV, is named as it is."""
    import torch
    from types import SimpleNamespace

    from megatron_loop.data import loaders
    from megatron_loop.data.loaders import LoaderFailure, SupervisedBatches

    monkeypatch.setattr(loaders, "shared_memory_free", lambda: (512 << 20, 1024 << 20))
    batches = SupervisedBatches(torch.utils.data.DataLoader(list(range(4)), num_workers=1), timeout_s=30)

    class Broken:
        _workers = [SimpleNamespace(pid=4242, exitcode=code)]

        def __next__(self):
            raise ConnectionResetError(104, "Connection reset by peer")

    batches._batches = Broken()
    with pytest.raises(LoaderFailure) as e:
        next(batches)
    assert str(e.value) == f"data.num_workers=1: DataLoader worker (pid 4242) was killed by signal {cause}"
    text = ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers "
            "are out of shared memory. Please try to raise your shared memory limit.")
    assert loaders.loader_failure(RuntimeError(text), 1) == (
        "data.num_workers=1: DataLoader worker (pid 4242) was killed by signal SIGBUS (Bus error: a memory-mapped "
        "file shrank under it, or shared memory ran out)")
    monkeypatch.setattr(loaders, "shared_memory_free", lambda: (0, 64 << 20))
    assert loaders.loader_failure(RuntimeError(text), 1).startswith(
        "data.num_workers=1: shared memory (/dev/shm) is full (0.0 MiB free of 64 MiB; a worker was killed by SIGBUS")
