"""The first GPU session, one command of at most ~9 minutes: the headline figures first, every result in
OUT_DIR the moment it exists, so a command killed at its limit still returns what it measured.

    bash tools/gpu_first.sh "$OUT"            # the device (one H100/H200; carry .gpu: tools/gpu_wheels.sh)
    bash tools/gpu_first.sh OUT_DIR --smoke   # CPU, tiny sizes, the same steps (tests/integration/tools/test_gpu_first.py)

OUT_DIR receives first.log (everything printed), summary.md (rewritten after every step), steps.tsv,
kernel.json, headline.jsonl, second.jsonl and loss.json; the rest stays in GPU_FIRST_WORK (a new folder
in /tmp). The steps (install, preamble, data, kernel, headline, train-per_loop or train-eager, loss),
their limits, the knobs (GPU_FIRST_BUDGET_S, GPU_FIRST_TRAIN_STEPS, GPU_FIRST_WORK, GPU_KIT,
GPU_FIRST_DATA, GPU_REPORT_COMMIT, PYTHON) and what a failure does: docs/BENCHMARKS.md, "The first GPU
session". Exit status: 0 when every step that ran succeeded, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .report_sections import write_report
from .session import Session, Tee

ACCUMULATION = 2  # fp32 gradient accumulation across micro-batches runs in every training step


def run(out: Path, smoke: bool) -> int:
    work = Path(os.environ.get("GPU_FIRST_WORK") or tempfile.mkdtemp(prefix="gpu_first."))
    # everything from here on, errors too, is printed and reaches OUT_DIR as it is printed
    sys.stdout = sys.stderr = Tee(sys.stdout, out / "first.log")
    budget = float(os.environ.get("GPU_FIRST_BUDGET_S") or (900 if smoke else 540))
    s = Session("gpu_first", out, work, smoke, budget, reserve_s=8, min_step_s=10)
    r = s.runner
    r.on_signals()  # a stopped driver ends the running step first
    skip = 1 if smoke else 3  # medians leave out compile and warm-up

    def summarize() -> None:
        try:
            write_report(out, first=True, smoke=smoke, skip=skip, logs=s.logs, budget=budget, started=r.start)
        except Exception as e:  # noqa: BLE001 - a broken summary must not end the session
            r.log(f"summary: failed ({type(e).__name__}: {e})")

    def finish(code: int) -> int:
        summarize()
        print()
        if (out / "summary.md").exists():
            print((out / "summary.md").read_text(), end="")
        files = " ".join(sorted(p.name for p in out.iterdir()))
        r.log(f"first session: exit code {code} after {time.time() - r.start:.0f} s; results in {out} ({files} )")
        return code

    def abort(sid: str) -> int:
        r.log(f"ABORTED at step {sid}: {s.last_error(sid) or 'see its output above'}")
        (s.logs / "aborted").write_text(sid + "\n")
        return finish(1)

    r.log(f"first GPU session ({'CPU smoke: tiny sizes' if smoke else 'GPU'}) into {out}; work folder {work}; "
          f"budget {budget:.0f} s")
    if not s.install():
        return abort("install")
    if not s.preamble():
        return abort("preamble")
    summarize()

    data = s.data(os.environ.get("GPU_FIRST_DATA"), 60)
    if data is None:
        r.train_failed = "data"

    kernel = ["--device", "cpu", "--vocab", "512", "--hidden", "64", "--tokens", "300", "--chunk", "128"] if smoke \
        else ["--device", "cuda"]
    sets: list[str] = []
    if not r.step("kernel", 60, [s.python, "-m", "megatron_loop.measure.loss_check", *kernel, "--json",
                                 str(out / "kernel.json")], env=s.env):
        sets = ["model.loss_implementation=chunked"]
        r.log("kernel check failed: the training runs use model.loss_implementation=chunked")
        with open(s.logs / "notes", "a") as f:
            f.write("the kernel check failed: the training runs used model.loss_implementation=chunked\n")
    summarize()

    micro, steps = (2, 3) if smoke else (38, 12)  # the paper's micro-batch on the device
    steps = int(os.environ.get("GPU_FIRST_TRAIN_STEPS") or steps)
    save_interval = 2 if smoke else 1_000_000  # the smoke: the interval save stays, the final one is skipped

    def train(run_id: str, cap_s: float, extra: list[str], keep_as: str, fail_fast: bool = True) -> None:
        cmd = s.train_command(run_id, "examples/llama_4x5.yaml", data or work / "data", micro, ACCUMULATION, steps,
                              sets + extra, save_interval)
        (r.train if fail_fast else r.step)(run_id, cap_s, cmd, env=s.env)
        metrics = work / "runs" / run_id / "metrics.jsonl"
        if metrics.exists():  # into OUT_DIR also after a timeout
            shutil.copyfile(metrics, out / keep_as)
        summarize()

    if r.enough_time("headline", 60):
        train("headline", 330, [], "headline.jsonl")
    if r.statuses.get("headline") == "ok":
        if r.enough_time("train-per_loop", 90):
            train("train-per_loop", 150, ["model.recompute=per_loop"], "second.jsonl")
    elif r.train_failed == "headline" and r.enough_time("train-eager", 90):  # does the path work without inductor?
        r.log("train-eager: the headline failed; the same run without compiled blocks (the one run after a failure)")
        train("train-eager", 150, ["model.compile=false"], "second.jsonl", fail_fast=False)

    # the loss bench trains nothing: it runs after a failure too
    bench = ["--device", "cpu", "--steps", "1", "--warmup", "0", "--seq", "16", "--micro-batch", "1"] if smoke \
        else ["--device", "cuda", "--steps", "6", "--warmup", "2", "--micro-batch", "8"]
    r.step("loss", 75, [s.python, "tools/bench.py", "--mode", "loss", "--families", "llama,qwen", *bench, "--json",
                        str(out / "loss.json")], env=s.env)
    return finish(1 if r.failed() else 0)
