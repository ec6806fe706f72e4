"""tools/gpu_first.sh, the first GPU session in one command (megatron_loop/gpu/first.py), run end to end
on CPU (--smoke, tiny sizes), and the parts it stands on: the step runner (megatron_loop/gpu/steps.py:
limits that end the whole process group, fail-fast), the preamble, the kit install and the data
(megatron_loop/gpu/env.py), the kernel check (megatron_loop/measure/loss_check.py) and the summary
(megatron_loop/gpu/report_sections.py).
No timing is asserted (GPU figures: docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from gpu_fixtures import make_smoke_data, markdown_table, report_sections
from testpaths import REPO

from megatron_loop.gpu import env as gpu_env
from megatron_loop.gpu import session
from megatron_loop.gpu.report_inputs import Inputs
from megatron_loop.gpu.report_sections import write_report
from megatron_loop.gpu.steps import Runner
from megatron_loop.gpu.tables import cpu_name
from megatron_loop.measure import loss_check
from megatron_loop.model.loss import CHUNK_LOSSES

ROOT = REPO

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.update(extra)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _first(out: Path, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "tools/gpu_first.sh", str(out), *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _number(cell: str) -> float:
    return float(cell.split()[0])


def _steps(out: Path) -> dict[str, list[str]]:
    return {f[0]: f[1:] for f in (line.split("\t") for line in (out / "steps.tsv").read_text().splitlines())}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_first")
    data = make_smoke_data()
    out, work = root / "out", root / "work"
    result = _first(out, "--smoke", GPU_FIRST_DATA=str(data), GPU_FIRST_WORK=str(work))
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-3000:])
    return out, work, result.stdout, (out / "summary.md").read_text()


# ----------------------------------------------------------------------------- the smoke run


def test_smoke_runs_every_step_and_delivers_what_the_device_can_return(smoke):
    out, work, stdout, summary = smoke
    # what comes back from the device: at most 8 plain files, names of letters, digits, '.', '_', '-'
    files = sorted(p.name for p in out.iterdir())
    assert files == ["first.log", "headline.jsonl", "kernel.json", "loss.json", "second.jsonl", "steps.tsv",
                     "summary.md"]
    assert all((out / f).is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    steps = _steps(out)
    assert list(steps) == ["install", "preamble", "data", "kernel", "headline", "train-per_loop", "loss"]
    assert steps["install"][0].startswith("skipped: no kit")
    assert all(steps[s][0] == "ok" for s in list(steps)[1:]), steps
    # first.log holds everything printed, the steps' own output included (streamed while they ran)
    log = (out / "first.log").read_text()
    assert log == stdout
    for line in ("import megatron.core: ok, version", "loss check: PASS", "step 3/3 | loss", "resolved config: "):
        assert line in log, line
    # the last thing printed is the summary, then where the results are
    assert stdout.rstrip().endswith(f"results in {out} ({' '.join(files)} )")
    assert summary.strip().splitlines()[-1] in stdout.strip().splitlines()[-2]


def test_smoke_headline_figures_are_the_medians_of_the_run(smoke):
    """The headline: the shipped Llama 4x5 through the deepspeed launcher, micro-batch x 2 accumulation;
    its figures are the medians of its metrics.jsonl after the first step, the peak the largest, the
    first-step time step 1's; the precision and checkpointing-plan lines are the run's own."""
    out, work, _, summary = smoke
    section = next(v for k, v in report_sections(summary).items() if k.startswith("Headline"))
    assert "micro-batch 2 x 2 accumulation" in section.splitlines()[0]
    rows = {r["figure"]: r for r in markdown_table(section)}
    steps = [r for r in map(json.loads, (out / "headline.jsonl").read_text().splitlines()) if r["event"] == "train"]
    assert len(steps) == 3
    assert _number(rows["tokens/s"]["value"]) == pytest.approx(statistics.median(r["tokens_per_s"] for r in steps[1:]),
                                                               rel=1e-3)
    assert _number(rows["MFU"]["value"]) == pytest.approx(100 * statistics.median(r["mfu"] for r in steps[1:]),
                                                          rel=1e-3)
    assert _number(rows["peak memory"]["value"]) == pytest.approx(max(r["mem_peak_gib"] for r in steps), rel=1e-3)
    assert _number(rows["first step (compile, warm-up)"]["value"]) == pytest.approx(steps[0]["step_time_s"], rel=1e-3)
    assert rows["loss first -> last"]["value"] == f"{steps[0]['loss']:.4g} -> {steps[-1]['loss']:.4g}"
    assert rows["tokens/s"]["target (one H100)"] == ">= 88000" and rows["tokens/s"]["verdict"] == "n/a (CPU smoke)"
    assert _number(rows["MFU"]["ratio to target"]) == pytest.approx(_number(rows["MFU"]["value"]) / 50, rel=1e-2)
    log = (work / "logs" / "headline.log").read_text()
    precision = next(line for line in log.splitlines() if line.startswith("precision: "))
    plan = next(line for line in log.splitlines() if line.startswith("activation recomputation auto over 5 loops"))
    assert f"* precision: `{precision}`" in section and f"* checkpointing plan: `{plan}`" in section
    assert f"device **{(work / 'logs' / 'device.txt').read_text().strip()}**" in section
    resolved = Inputs(out, 1, work / "logs").resolved_config("headline")
    assert resolved["train"]["global_batch_size"] == 2 * resolved["train"]["micro_batch_size"] == 4
    assert resolved["model"]["recompute"] == "auto" and resolved["train"]["save_final"] is False


def test_smoke_runs_skip_only_the_final_checkpoint(smoke):
    """train.save_final=false: the interval save (step 2 of 3, smoke only) is written, the final one is not."""
    _, work, _, _ = smoke
    for run in ("headline", "train-per_loop"):
        ckpt = work / "runs" / run / "checkpoints"
        assert sorted(p.name for p in ckpt.glob("global_step*")) == ["global_step2"], run
        metrics = [json.loads(line) for line in (work / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in metrics if r["event"] == "checkpoint"] == [2]
        assert metrics[-1]["event"] == "summary" and metrics[-1]["step"] == 3


def test_smoke_second_run_is_per_loop_and_compared_with_the_headline(smoke):
    out, _, _, summary = smoke
    title, section = next((k, v) for k, v in report_sections(summary).items() if k.startswith("Second run"))
    assert "recompute=per_loop" in title and "checkpointing plan: `per_loop (fixed)`" in section
    rows = {r["figure"]: r for r in markdown_table(section)}
    head = Inputs(out, 1).train("headline")
    second = Inputs(out, 1).train("train-per_loop")
    assert _number(rows["tokens/s"]["vs headline (same device)"]) == pytest.approx(
        second["tokens_per_s"] / head["tokens_per_s"], rel=1e-3)


def test_smoke_kernel_check_and_loss_bench_are_in_the_summary(smoke):
    out, _, _, summary = smoke
    kernel = json.loads((out / "kernel.json").read_text())
    assert kernel["pass"] is True and [r["implementation"] for r in kernel["rows"]] == ["chunked"]
    sections = report_sections(summary)
    rows = markdown_table(next(v for k, v in sections.items() if k.startswith("Kernel check")))
    assert rows[0]["case"] == "V 512 chunked" and rows[0]["verdict"] == "pass" and rows[0]["host syncs"] == "0"
    assert 0 < _number(rows[0]["rel d hidden"]) < loss_check.TOLERANCES["grad_hidden"]
    loss = markdown_table(next(v for k, v in sections.items() if k.startswith("LM head")))
    assert {r["case"] for r in loss} == {"llama head+CE chunked", "qwen head+CE chunked"}
    assert all(r["host_syncs"] == "0" for r in loss)


# ----------------------------------------------------------------------------- aborting, usage


def test_a_failing_import_aborts_at_once_with_the_module_and_the_error(tmp_path):
    """A device whose deepspeed does not import (simulated by a stub first on PYTHONPATH): the preamble
    ends the command within seconds, exit 1, the failed import and its error the last error line; no
    training step starts."""
    stub = tmp_path / "stub" / "deepspeed"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pydantic_core._pydantic_core' (simulated)\")\n")
    out = tmp_path / "out"
    start = time.monotonic()
    result = _first(out, "--smoke", timeout=120, GPU_FIRST_WORK=str(tmp_path / "work"),
                    PYTHONPATH=str(tmp_path / "stub"))
    assert result.returncode == 1, result.stdout[-3000:]
    assert time.monotonic() - start < 60
    error = ("error: import deepspeed failed: ModuleNotFoundError: No module named 'pydantic_core._pydantic_core' "
             "(simulated)")
    log = (out / "first.log").read_text()
    assert [ln for ln in log.splitlines() if ln.startswith("error:")][-1] == error
    assert f"ABORTED at step preamble: {error}" in log
    assert list(_steps(out)) == ["install", "preamble"] and _steps(out)["preamble"][0] == "failed"
    summary = (out / "summary.md").read_text()
    assert "**ABORTED at step preamble**" in summary and error in summary


def test_bad_usage_is_one_error_line(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "first.log").write_text("an earlier session")
    for args in ((str(tmp_path / "old"),), (str(tmp_path / "new"), "--fast"), ()):
        result = subprocess.run(["bash", "tools/gpu_first.sh", *args], cwd=ROOT, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "old" / "first.log").read_text() == "an earlier session"
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- the step runner


def _runner(tmp_path: Path, budget: float = 100, **kw) -> Runner:
    return Runner("test", tmp_path / "steps.tsv", tmp_path, budget_s=budget, reserve_s=0, min_step_s=1,
                  stream=False, **kw)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(path: Path, words: int) -> list[int]:
    deadline = time.monotonic() + 30
    while not (path.exists() and len(path.read_text().split()) == words) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def test_a_step_past_its_limit_is_ended_with_all_its_processes(tmp_path, capsys):
    """The fake step traps SIGTERM (as a training worker does, to save) and keeps a child that ignores it:
    at the limit every process of the step gets SIGTERM, after the grace period SIGKILL; none is left
    when the runner returns (a `timeout -k` on the launcher alone left the worker running)."""
    pids = tmp_path / "pids"
    fake = tmp_path / "fake.sh"
    fake.write_text(f"trap 'echo fake: SIGTERM ignored' TERM\n(trap '' TERM; exec sleep 300) &\n"
                    f"echo $$ $! > {pids}\nwhile true; do sleep 0.1; done\n")
    runner = _runner(tmp_path, grace_s=1)
    start = time.monotonic()
    assert runner.step("fake", 1, ["bash", str(fake)]) is False
    took = time.monotonic() - start
    assert _steps(tmp_path)["fake"][:2] == ["timed out", "124"]
    assert 1.9 <= took < 15  # limit 1 s + grace 1 s, then the KILL
    assert "SIGKILL" in capsys.readouterr().out
    assert (tmp_path / "fake.log").read_text().count("fake: SIGTERM ignored") >= 1
    leftover = _wait_for(pids, 2)
    assert len(leftover) == 2 and not any(_alive(p) for p in leftover)


def test_processes_a_step_leaves_behind_are_ended(tmp_path, capsys):
    pids = tmp_path / "pids"
    runner = _runner(tmp_path, grace_s=1)
    assert runner.step("quick", 30, ["bash", "-c", f"sleep 300 & echo $! > {pids}"])
    assert "left processes" in capsys.readouterr().out
    assert _steps(tmp_path)["quick"][0] == "ok"
    assert not _alive(int(pids.read_text()))


def test_a_stopped_driver_ends_the_running_step(tmp_path):
    """SIGTERM to the driver (a caller's own time limit): the running step's processes end with it, exit 143."""
    pids = tmp_path / "pids"
    script = (f"from pathlib import Path; from megatron_loop.gpu.steps import Runner\n"
              f"r = Runner('t', Path({str(tmp_path / 'steps.tsv')!r}), Path({str(tmp_path)!r}), 100, 0, 1, stream=False)\n"
              f"r.on_signals()\n"
              f"r.step('long', 60, ['bash', '-c', '(exec sleep 300) & echo $$ $! > {pids}; wait'])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    step = _wait_for(pids, 2)
    assert all(_alive(p) for p in step)
    proc.terminate()
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "stopped by a signal" in output, output
    assert not any(_alive(p) for p in step)


def test_fail_fast_skips_the_next_training_step_not_the_others(tmp_path):
    runner = _runner(tmp_path)
    assert not runner.train("first", 10, ["bash", "-c", "echo error: broken >&2; exit 3"])
    assert not runner.train("second", 10, ["true"])
    assert runner.step("bench", 10, ["true"])
    assert runner.step("missing", 10, ["no-such-command-here"]) is False
    assert _runner(tmp_path / "sel", only=("other",)).step("unselected", 10, ["true"])
    assert _runner(tmp_path / "late", budget=0).step("late", 10, ["true"])
    steps = _steps(tmp_path)
    assert steps["first"][:2] == ["failed", "3"] and (tmp_path / "first.log").read_text() == "error: broken\n"
    assert steps["second"][0] == "skipped: training step first failed (fail-fast)"
    assert steps["bench"][0] == "ok" and steps["missing"][:2] == ["failed", "127"]
    assert "error: cannot start no-such-command-here" in (tmp_path / "missing.log").read_text()
    assert _steps(tmp_path / "sel")["unselected"][0] == "skipped: not selected"
    assert _steps(tmp_path / "late")["late"][0] == "skipped: out of time"
    assert runner.failed()


def test_a_step_streams_its_output_while_it_runs(tmp_path, capfd):
    """stream=True (the device): the step's output reaches stdout before the step ends."""
    runner = Runner("test", tmp_path / "steps.tsv", tmp_path, 100, 0, 1, stream=True)
    assert runner.step("talk", 30, ["bash", "-c", "echo first line; sleep 0.6; echo second line"])
    out = capfd.readouterr().out
    assert out.index("first line") < out.index("second line") < out.index("talk: ok")


# ----------------------------------------------------------------------------- install and kernel check


def test_a_failed_wheel_install_shows_pips_error(tmp_path):
    kit = tmp_path / "kit"
    (kit / "whl").mkdir(parents=True)
    (kit / "whl" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip archive")

    def install(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "megatron_loop.gpu.env", "install", str(folder), "--site",
                               str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env=_env())

    result = install(kit)
    assert result.returncode == 1
    assert "broken-1.0-py3-none-any.whl" in result.stderr.split("error: pip install")[0]  # pip's own words first
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: pip install of {kit}/whl into")
    empty = install(tmp_path)
    assert empty.returncode == 1 and "no wheels" in empty.stderr


def test_the_device_branches_on_cpu(tmp_path, capsys, monkeypatch):
    """What only the device runs, on a machine without a GPU: the preamble's --cuda refuses a machine
    nvidia-smi does not see (at once, before any import), the device's name falls back to the CPU's, and
    the device's training command is the shipped config at micro-batch 38 x 2, unshrunk."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert gpu_env.check(cuda=True) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "error: nvidia-smi failed: no GPU visible"
    assert session.device_name(smoke=False) == cpu_name()
    (tmp_path / "out").mkdir()
    s = session.Session("t", tmp_path / "out", tmp_path / "work", smoke=False, budget_s=540, reserve_s=8,
                        min_step_s=10)
    cmd = s.train_command("headline", "examples/llama_4x5.yaml", tmp_path / "data", 38, 2, 12, [])
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert cmd[1:3] == ["--num_gpus", "1"] and cmd[5:8] == ["pretrain_loop.py", "--config", "examples/llama_4x5.yaml"]
    assert {"train.micro_batch_size=38", "train.global_batch_size=76", "train.max_steps=12",
            "train.save_final=false", "train.save_interval=1000000"} <= set(sets)
    assert not any(x.startswith("model.") for x in sets)  # as shipped: compile, fused loss, recompute auto
    assert s.runner.cap_scale == 1 and s.env["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path / "work" / "site"),
                                                                                     str(ROOT)]


def _scaled(factor_loss: float, factor_grad: float):
    def chunk_loss(hidden, weight, targets, ignore_index, need_grad):
        loss, grad = CHUNK_LOSSES["chunked"](hidden, weight, targets, ignore_index, need_grad)
        return loss * factor_loss, (grad * factor_grad if grad is not None else None)
    return chunk_loss


def _reads_host(hidden, weight, targets, ignore_index, need_grad):
    loss, grad = CHUNK_LOSSES["chunked"](hidden, weight, targets, ignore_index, need_grad)
    if loss.item() < 0:  # a host read, as Liger's own entry point makes
        raise AssertionError
    return loss, grad


def _broken(hidden, weight, targets, ignore_index, need_grad):
    raise RuntimeError("PassManager::run failed (simulated Triton failure)")


def test_kernel_check_passes_the_reference_and_fails_a_wrong_kernel():
    impls = {"chunked": "chunked", "loss+1%": _scaled(1.01, 1.0), "grad+5%": _scaled(1.0, 1.05),
             "nan": _scaled(float("nan"), 1.0), "sync": _reads_host, "broken": _broken}
    rows = {r["implementation"]: r for r in loss_check.check_vocab(300, 32, 96, impls, torch.device("cpu"), chunk=64)}
    assert rows["chunked"]["pass"] is True and rows["chunked"]["why"] == []
    assert rows["chunked"]["rel_loss"] < 1e-4 and 0 < rows["chunked"]["rel_grad_hidden"] < 0.02
    assert rows["loss+1%"]["pass"] is False and rows["loss+1%"]["why"][0].startswith("loss = 0.01")
    assert rows["grad+5%"]["pass"] is False
    assert [w.split(" =")[0] for w in rows["grad+5%"]["why"]] == ["grad_hidden", "grad_weight"]
    assert rows["nan"]["pass"] is False and "non-finite loss or gradient" in rows["nan"]["why"]
    assert rows["sync"]["pass"] is False and rows["sync"]["host_syncs"] >= 1
    assert rows["broken"]["pass"] is False and "simulated Triton failure" in rows["broken"]["why"][0]
    assert rows["chunked vs loss+1%"]["pass"] is None  # compared, not judged
    assert rows["chunked vs loss+1%"]["rel_loss"] == pytest.approx(0.01 / 1.01, rel=1e-3)


def test_kernel_check_command_line(tmp_path):
    """Exit 0 and a passing JSON on CPU (chunked only, as the smoke); 2 on a bad argument."""
    assert loss_check.main(["--device", "cpu", "--vocab", "260", "--hidden", "16", "--tokens", "40", "--chunk", "16",
                            "--json", str(tmp_path / "k.json")]) == 0
    data = json.loads((tmp_path / "k.json").read_text())
    assert data["pass"] is True and data["implementations"] == ["chunked"] and data["failed"] == []
    assert loss_check.main(["--device", "cpu", "--implementations", "cuda-magic"]) == 2


# ----------------------------------------------------------------------------- like with like


def test_a_figure_from_another_gpu_gets_no_verdict(tmp_path):
    """The targets are for one H100; an H200 (a different `auto` plan, more memory) is shown, not compared."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "steps.tsv").write_text("headline\tok\t0\t100\t330\tdeepspeed ...\n")
    records = [{"event": "train", "step": s, "loss": 12.0 - s, "tokens_per_s": 95000.0, "mfu": 0.52,
                "step_time_s": 1.6, "mem_peak_gib": 61.0} for s in range(1, 7)]
    (tmp_path / "headline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plan = ("activation recomputation auto over 5 loops: selective x2, none x3; predicted peak 61.20 GiB, "
            "recomputing 0.60 loop forwards")
    (logs / "headline.log").write_text(f"precision: bf16 weights\n{plan}\n")
    verdicts = {}
    for device in ("NVIDIA H200, 143771 MiB", "NVIDIA H100 80GB HBM3, 81559 MiB"):
        (logs / "device.txt").write_text(device + "\n")
        write_report(tmp_path, first=True, smoke=False, skip=3, logs=logs)
        summary = (tmp_path / "summary.md").read_text()
        assert f"device **{device}**" in summary and "plan `auto over 5 loops: selective x2, none x3; " \
                                                     "predicted peak 61.20 GiB`" in summary
        verdicts[device] = {r["figure"]: r["verdict"] for r in markdown_table(report_sections(summary)[next(
            k for k in report_sections(summary) if k.startswith("Headline"))])}
    h200, h100 = verdicts.values()
    assert h200["MFU"] == "not compared: measured on NVIDIA H200, 143771 MiB, the target is for one H100"
    assert h100["MFU"] == "met" and h100["tokens/s"] == "met" and h100["peak memory"] == "met"


def test_the_data_step_runs_the_three_tools_into_the_layout_the_sessions_read(tmp_path):
    """The data step (the device's fallback when the kit carries no data; the kit's own build): the real
    corpus generator and tokenizer trainer, then preprocess_data.py -- stood in for here (it imports
    megatron-core: seconds), checked for its arguments and made to write the indexed files -- into
    DATA/corpus.{bin,idx} and DATA/tokenizer."""
    fake = tmp_path / "py"
    fake.write_text(f"""#!/bin/bash
case "$1" in
  tools/preprocess_data.py)
    echo "$@" > {tmp_path}/preprocess.args
    while [ $# -gt 0 ]; do [ "$1" = --output-prefix ] && prefix=$2; shift; done
    mkdir -p "$(dirname "$prefix")" && touch "$prefix.bin" "$prefix.idx" ;;
  *) exec {sys.executable} "$@" ;;
esac
""")
    fake.chmod(0o755)
    data = tmp_path / "data"
    result = subprocess.run([sys.executable, "-m", "megatron_loop.gpu.env", "data", str(data),
                             f"{tmp_path}/scratch", "1", "--prose-docs", "20", "--reasoning-docs-per-task", "5",
                             "--valid-docs", "2", "--eval-items-per-depth", "1"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=_env(PYTHON=str(fake)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert gpu_env.prepared_data(data)
    assert (data / "tokenizer" / "tokenizer.json").is_file() and (tmp_path / "scratch/corpus/train.jsonl").is_file()
    assert (tmp_path / "preprocess.args").read_text().split() == [
        "tools/preprocess_data.py", "--input", f"{tmp_path}/scratch/corpus/train.jsonl", "--tokenizer",
        f"{data}/tokenizer", "--output-prefix", f"{data}/corpus", "--workers", "1", "--no-progress"]


def _fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_the_kit_carries_the_locks_versions_and_stops_on_an_unmet_requirement(tmp_path):
    """tools/gpu_wheels.sh --check (no download): one wheel per carried package at the version
    requirements-lock.txt pins (another version is removed), and every requirement of each met by a
    carried wheel or by the device image; an unmet or unknown one, or a missing wheel, stops the kit."""
    pinned = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "requirements-lock.txt").read_text(), flags=re.M)
    lock = {spelling: version for name, version in pinned  # any spelling of a name (PEP 503), as the kit reads it
            for spelling in {name, name.lower(), re.sub(r"[-_.]+", "_", name).lower(), re.sub(r"[-_.]+", "-", name).lower()}}
    carry = ("deepspeed", "megatron-core", "liger_kernel", "hjson", "pydantic", "pydantic_core", "annotated-types",
             "typing-inspection", "typing_extensions", "transformers", "packaging")
    requires = {"transformers": ("huggingface-hub<3.0,>=1.31.0", "tokenizers<0.24.0,>=0.23.1", "regex>=2025.10.22",
                                 "pytest; extra == 'testing'"),
                "pydantic": (f"pydantic-core=={lock['pydantic_core']}", "typing-extensions>=4.16.0"),
                "deepspeed": ("torch>=2.0.0", "hjson", "pydantic>=2.0.0")}
    whl = tmp_path / "kit" / "whl"
    whl.mkdir(parents=True)
    for name in carry:
        _fake_wheel(whl, name, lock[name], requires.get(name, ()))
    stale = _fake_wheel(whl, "transformers", "5.17.0")

    def check() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "tools/gpu_wheels.sh", "--check", str(tmp_path / "kit")], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=_env(VENV_PY=sys.executable))

    ok = check()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert not stale.exists() and f"removing {stale.name}" in ok.stdout
    assert f"transformers {lock['transformers']} requires huggingface-hub<3.0,>=1.31.0: image 1.33.0" in ok.stdout
    assert "requires regex>=2025.10.22: image >=2025.10.22" in ok.stdout and "pytest" not in ok.stdout
    _fake_wheel(whl, "megatron-core", lock["megatron-core"], ("tokenizers>=0.24", "flash-attn"))
    (whl / f"hjson-{lock['hjson']}-py3-none-any.whl").unlink()
    bad = check()
    assert bad.returncode == 1
    assert f"megatron-core {lock['megatron-core']} requires tokenizers>=0.24: image 0.23.2" in bad.stderr
    assert "requires flash-attn: neither carried nor known in the image" in bad.stderr
    assert f"hjson=={lock['hjson']}: no wheel was downloaded" in bad.stderr
