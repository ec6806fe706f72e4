"""The second GPU session: every GPU target of docs/BENCHMARKS.md that the first session (the Llama 4x5
headline, the kernel check, the loss bench) leaves, in ONE markdown report.

    bash tools/gpu_report.sh OUT_DIR             # one H100/H200 (carry .gpu: tools/gpu_wheels.sh): under 9 minutes
    bash tools/gpu_report.sh OUT_DIR --smoke     # CPU, tiny sizes, the same steps (a test runs it)

OUT_DIR receives REPORT.md, artifacts.tar.gz (every step's log and JSON, the runs' metrics.jsonl) and the
working files; at most 8 files come back from the device's $OUT, so write OUT_DIR in /tmp and copy the two.
The steps (install, preamble, data, train-qwen and train-qwen-per_loop, ckpt, peers, recompute, profile,
kept; train-llama and its per_loop twin with GPU_REPORT_ONLY), their commands and the knobs
(GPU_REPORT_BUDGET_S, GPU_REPORT_TRAIN_STEPS, GPU_REPORT_ACCUMULATION, GPU_REPORT_ONLY, GPU_REPORT_DATA,
GPU_REPORT_DEVICE=cpu for --smoke, GPU_KIT, GPU_REPORT_COMMIT, PYTHON): docs/BENCHMARKS.md, "The GPU
report". Exit status: 0 when every step that ran succeeded, 1 otherwise (the report is written either
way), 2 on bad usage or a failed preamble.
"""

from __future__ import annotations

import os
import sys
import tarfile
import time
from pathlib import Path

from .report_sections import write_report
from .session import Session

CPU_ONLY_SKIPS = {  # what CPU cannot run in a test's time, listed so the report says so
    "peers-compiled": "skipped on CPU: inductor compiles take minutes on CPU (the peers step runs eager only)",
    "kept-compile": "skipped on CPU: inductor compiles take minutes on CPU (recompiles across r: "
                    "tests/unit/parallel/test_parallelize.py)",
}


def config_micro_batch(config: str) -> int:
    from megatron_loop.config import load_config  # yaml only: no torch

    return load_config(config).train.micro_batch_size


def artifacts(out: Path) -> None:
    """artifacts.tar.gz: steps.tsv, the logs, the runs (no checkpoints) and every step's JSON."""
    tmp = out / "artifacts.tar.gz.tmp"

    def no_checkpoints(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = Path(info.name).name
        return None if name.startswith("global_step") or name.startswith("zero_to_") else info

    with tarfile.open(tmp, "w:gz") as tar:
        for name in ("steps.tsv", "logs", "runs", *sorted(f"./{p.name}" for p in out.glob("*.json"))):
            if (out / name).exists():
                tar.add(out / name, arcname=name, filter=no_checkpoints)
    tmp.replace(out / "artifacts.tar.gz")


def run(out: Path, smoke: bool) -> int:
    only = tuple(x for x in os.environ.get("GPU_REPORT_ONLY", "").split(",") if x)
    budget = float(os.environ.get("GPU_REPORT_BUDGET_S") or (900 if smoke else 540))
    s = Session("gpu_report", out, out, smoke, budget, reserve_s=20, min_step_s=20, stream=not smoke,
                only=("install", "preamble", *only) if only else ())
    r = s.runner
    r.on_signals()  # a stopped driver ends the running step first
    r.log(f"report of {'cpu' if smoke else 'cuda'} ({'CPU smoke: tiny sizes' if smoke else 'GPU'}) into {out}; "
          f"budget {budget:.0f} s")
    if not s.install():
        print(f"error: the wheel kit did not install (its log: {s.logs}/install.log)", file=sys.stderr)
        return 2
    if not s.preamble():
        failed = s.last_error("preamble") or ""
        module = failed.split("error: import ", 1)[1].split(" failed:", 1)[0] if failed.startswith(
            "error: import ") else "the training path"
        print(failed or f"error: the preamble failed (its log: {s.logs}/preamble.log)", file=sys.stderr)
        print(f"error: {module}: missing for {s.python}; on the GPU machine run 'source .gpu/device_env.sh' first "
              "(the kit: tools/gpu_wheels.sh)", file=sys.stderr)
        return 2

    data = s.data(os.environ.get("GPU_REPORT_DATA"), 120)
    if data is None:
        r.train_failed = "data"
    steps = int(os.environ.get("GPU_REPORT_TRAIN_STEPS") or (3 if smoke else 12))
    accumulation = int(os.environ.get("GPU_REPORT_ACCUMULATION") or 2)

    def train(run_id: str, config: str, cap_s: float, extra: list[str]) -> None:
        micro = 2 if smoke else config_micro_batch(config)  # the config's own on the device
        r.train(run_id, cap_s, s.train_command(run_id, config, data or out / "data", micro, accumulation, steps,
                                               extra), env=s.env)

    if only and "train-llama" in only:  # the first session's runs, on request
        train("train-llama", "examples/llama_4x5.yaml", 150, [])
        train("train-llama-per_loop", "examples/llama_4x5.yaml", 110, ["model.recompute=per_loop"])
    train("train-qwen", "examples/qwen_4x7.yaml", 150, [])
    train("train-qwen-per_loop", "examples/qwen_4x7.yaml", 110, ["model.recompute=per_loop"])

    if smoke:
        common, mb_small, mb_paper, top = ["--device", "cpu", "--steps", "1", "--warmup", "0", "--seq", "16"], 1, 2, 8
        compile_, ckpt_budget, kept_modes = [], [], "loop-vs-nonloop,optimizer"
    else:
        common, mb_small, mb_paper, top = ["--device", "cuda", "--steps", "6", "--warmup", "2"], 8, 38, 15
        compile_, ckpt_budget, kept_modes = ["--compile"], ["--ac-budget-gib", "50"], "loop-vs-nonloop,compile,optimizer"

    def bench(sid: str, cap_s: float, *args: str) -> None:
        r.step(sid, cap_s, [s.python, "tools/bench.py", *common, *args, "--json", str(out / f"{sid}.json")],
               env=s.env)

    bench("ckpt", 90, "--mode", "checkpointing", *compile_, "--families", "llama", "--loops", "5", "--micro-batch",
          str(mb_paper), "--ac-modes", "none,per_loop,selective,auto", "--ac-reference-micro-batch", str(mb_small),
          *ckpt_budget)
    bench("peers", 150, "--mode", "peers", *compile_, "--families", "llama", "--micro-batch", str(mb_small))
    bench("recompute", 60, "--mode", "recompute", *compile_, "--families", "llama", "--loops", "5", "--micro-batch",
          str(mb_small))
    bench("profile", 60, "--mode", "profile", *compile_, "--config", "examples/llama_4x5.yaml", "--micro-batch",
          str(mb_small), "--top", str(top))
    # the Muon share at G = 1824 is extrapolated from t_opt and t_seq
    bench("kept", 120, "--mode", kept_modes, *compile_, "--families", "llama", "--micro-batch", str(mb_small),
          "--accumulation", "2")
    if smoke:
        for sid, why in CPU_ONLY_SKIPS.items():
            r.record(sid, why)

    failed = r.failed()
    try:
        write_report(out, first=False, smoke=smoke, skip=1 if smoke else 3, budget=budget, started=r.start)
    except Exception as e:  # noqa: BLE001 - said, and the exit status says it
        r.log(f"report: failed ({type(e).__name__}: {e})")
        failed = True
    artifacts(out)
    r.log(f"report: {out}/REPORT.md ({time.time() - r.start:.0f} s)")
    return 1 if failed else 0
