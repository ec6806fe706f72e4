"""Shared helpers for the training and reliability tests: a tiny run config on the bundled
corpus (``data_fixtures.data_assets``), CLI launchers (python / torchrun / deepspeed) and readers
for the metrics file and checkpoints. Plain functions, see data_fixtures.py for why."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from data_fixtures import data_assets
from megatron_loop.parallel.bootstrap import free_port
from testpaths import REPO, TRAIN_SCRIPTS

VENV_BIN = Path(sys.executable).parent
FAULTS = TRAIN_SCRIPTS / "faults.py"
TIMEOUT = 420


def tiny_config(directory: Path, name: str = "tiny.yaml", **sections) -> Path:
    """A CPU-sized 2x2 tiny-llama run on the test corpus; ``sections`` update model/train/data/logging."""
    assets = data_assets()
    cfg = {
        "model": {"backbone": "tiny-llama", "core_layers": 2, "train_loops": 2, "vocab_size": 640,
                  "recompute": "none"},
        "train": {"seq_length": 32, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3,
                  "max_steps": 10, "precision": "fp32", "deepspeed_config": "deepspeed_configs/zero1.json",
                  "output_dir": str(directory / "run"), "save_interval": 5, "log_interval": 1,
                  "eval_interval": 5, "eval_batches": 2},
        "data": {"train_prefixes": [assets.prefix], "num_workers": 0},
        "logging": {"progress_bar": False},
    }
    for section, values in sections.items():
        cfg[section].update(values)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1",
             PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)  # each launch picks its own world
    return e


def command(*args: str, nproc: int = 1, launcher: str = "python", script: str = "pretrain_loop.py") -> list[str]:
    target = str(REPO / script) if script == "pretrain_loop.py" else script
    if launcher == "python":
        return [sys.executable, target, *args]
    if launcher == "torchrun":
        return [str(VENV_BIN / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", str(free_port()),
                target, *args]
    if launcher == "deepspeed":
        return [str(VENV_BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port", str(free_port()),
                target, *args]
    raise ValueError(launcher)


def run_cli(*args: str, nproc: int = 1, launcher: str = "python", script: str = "pretrain_loop.py",
            timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args, nproc=nproc, launcher=launcher, script=script), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def launch_all(root: Path, launches: dict[str, tuple[int, list[str]]], timeout: float = TIMEOUT) -> None:
    """Run every ``name -> (ranks, [script, *args])`` at once (one process, or torchrun with ``ranks``),
    logs in ``root/<name>.log``; a failed or hung launch fails the test with its log's tail."""
    import pytest

    procs = {}
    for name, (ranks, (script, *args)) in launches.items():
        log = open(root / f"{name}.log", "w")
        cmd = command(*args, nproc=ranks, launcher="python" if ranks == 1 else "torchrun", script=script)
        procs[name] = (subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=log, stderr=subprocess.STDOUT), log)
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    for name, (proc, _) in procs.items():
        if proc.returncode != 0:
            pytest.fail(f"{name} failed (exit {proc.returncode}):\n{(root / f'{name}.log').read_text()[-4000:]}")


def start_cli(*args: str, nproc: int = 1, launcher: str = "python", script: str = "pretrain_loop.py",
              new_session: bool = False) -> subprocess.Popen:
    """``new_session``: the launch leads its own process group (``setsid``), so a test can signal
    the whole group as ``scancel`` or ``kill -- -PGID`` does."""
    return subprocess.Popen(command(*args, nproc=nproc, launcher=launcher, script=script), cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=new_session)


def kill_all_ranks(proc: subprocess.Popen) -> None:
    """SIGKILL every process of a launch at once (ranks first, then the launcher)."""
    import psutil

    parent = psutil.Process(proc.pid)
    for p in [*parent.children(recursive=True), parent]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.communicate(timeout=60)


def check_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


def records(run_dir: Path, event: str | None = None) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    out = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in out if event is None or r["event"] == event]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir, "train")}


def final_weights(run_dir: Path) -> dict:
    from megatron_loop.checkpoint.weights import consolidated_state_dict

    return consolidated_state_dict(run_dir / "checkpoints")


def assert_same_weights(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"weights differ bitwise: {different[:5]}"


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@dataclass(frozen=True)
class ReferenceRun:
    config: Path
    run_dir: Path
    result: subprocess.CompletedProcess


@functools.lru_cache(maxsize=None)
def reference_run() -> ReferenceRun:
    """One uninterrupted single-process ZeRO-1 run of 10 steps (checkpoints at 3, 6, 9, 10, the
    last 2 kept; loop dynamics at 5 and 10), shared by the loop, resume and reliability tests as the ground truth."""
    root = Path(tempfile.mkdtemp(prefix="looplm_train_tests_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    config = tiny_config(root, train={"save_interval": 3, "keep_last": 2}, logging={"dynamics_interval": 5})
    result = run_cli("--config", str(config))
    check_ok(result)
    return ReferenceRun(config, root / "run", result)


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = TIMEOUT) -> int:
    """Poll the metrics file until a train record with ``step >= step`` appears; returns that step."""
    import time

    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early (exit {proc.returncode}):\n{proc.stdout.read()[-4000:]}")
        if path.is_file():
            steps = [json.loads(line)["step"] for line in path.read_text().splitlines()
                     if line.endswith("}") and '"event": "train"' in line]
            if steps and max(steps) >= step:
                return max(steps)
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s")
