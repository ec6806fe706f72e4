"""What both GPU sessions share: the output folder, the log that gets everything printed, the sizes of a
device run and of the CPU smoke, the install and preamble steps, the data, the training command.

Only the standard library and this package's torch-free modules are imported: the driver starts before
the kit's wheels are installed, and a summary is written even when a step broke.
"""

from __future__ import annotations

import importlib
import os
import random
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import env as gpu_env
from .steps import Runner

ROOT = gpu_env.ROOT
SMOKE_CORPUS = ["--prose-docs", "200", "--reasoning-docs-per-task", "50", "--valid-docs", "2",
                "--eval-items-per-depth", "1"]
DEVICE_CORPUS = ["--prose-docs", "4000", "--reasoning-docs-per-task", "1500", "--valid-docs", "10",
                 "--eval-items-per-depth", "1"]
# the shipped configs at CPU widths (the same block structure), short sequences; the model keeps the
# tokenizer's 2048 ids; a declared CPU peak: training logs MFU only against a known one
SMOKE_MODEL = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_attention_heads=2",
               "model.num_key_value_heads=1", "model.head_dim=32", "model.vocab_size=2048", "model.rope_scaling=null",
               "train.seq_length=32", "logging.peak_tflops=0.05"]


class UsageError(Exception):
    """Bad usage: one ``error:`` line, exit code 2, nothing written."""


def output_folder(arg: str) -> Path:
    """OUT_DIR, new or empty (the device's $OUT), created; UsageError otherwise."""
    out = Path(os.path.abspath(arg))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"OUT_DIR '{arg}' exists and is not an empty folder; expected a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        raise UsageError(f"OUT_DIR '{arg}': cannot create it") from None
    return out


class Tee:
    """stdout and stderr of the driver into a file as well, as they are written (first.log)."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "ab", buffering=0)
        self.buffer = self

    def write(self, data) -> int:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self.file.write(raw)
        (self.stream.buffer if hasattr(self.stream, "buffer") else self.stream).write(raw)
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def free_port() -> int:
    """A free port for the launcher's rendezvous, below the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) can be taken by another process in the seconds the launch takes to start
    listening (seen on a shared machine: EADDRINUSE); one outside that range is not handed out."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(10000, max(low, 10001)), min(50, max(low - 10000, 1))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # none free below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_name(smoke: bool) -> str:
    """nvidia-smi's name and memory of the GPU, or the CPU's (the reports print it beside every figure)."""
    if not smoke:
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if smi.returncode == 0 and smi.stdout.strip():
                return smi.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    from .tables import cpu_name

    return cpu_name()


@dataclass
class Session:
    """One GPU session's settings and its step runner."""

    name: str  # gpu_first | gpu_report
    out: Path
    work: Path  # the step logs, data, runs
    smoke: bool
    budget_s: float
    reserve_s: float
    min_step_s: float
    stream: bool = True
    only: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: os.environ.get("PYTHON", sys.executable))
    kit: Path = field(default_factory=lambda: Path(os.environ.get("GPU_KIT", ROOT / ".gpu")))

    def __post_init__(self):
        self.logs = self.work / "logs"
        (self.work / "runs").mkdir(parents=True, exist_ok=True)
        self.runner = Runner(self.name, self.out / "steps.tsv", self.logs, self.budget_s, self.reserve_s,
                             self.min_step_s, cap_scale=3 if self.smoke else 1, stream=self.stream, only=self.only)
        self.site = self.work / "site"
        self.env = gpu_env.environment(self.site)

    # ------------------------------------------------------------------ install, preamble
    def install(self) -> bool:
        """The kit's wheels (on the device; in the smoke only a GPU_KIT given) into the steps' path."""
        if (self.kit / "whl").is_dir() and (not self.smoke or "GPU_KIT" in os.environ):
            ok = self.runner.step("install", 90, [self.python, "-m", "megatron_loop.gpu.env", "install",
                                                  str(self.kit), "--site", str(self.site)], env=self.env)
            if ok:  # the reports read the kit's package versions in this process too
                sys.path.insert(0, str(self.site))
                importlib.invalidate_caches()
            return ok
        self.runner.record("install", f"skipped: no kit at {self.kit}/whl"
                           + (" (CPU smoke: the installed packages)" if self.smoke else "")
                           + "; the packages already installed are used")
        return True

    def preamble(self) -> bool:
        cmd = [self.python, "-m", "megatron_loop.gpu.env", "check", *([] if self.smoke else ["--cuda"])]
        ok = self.runner.step("preamble", 45, cmd, env=self.env)
        (self.logs / "device.txt").write_text(device_name(self.smoke) + "\n")
        return ok

    def last_error(self, sid: str) -> str | None:
        """The last error line of a step's log (``error: ...`` or a Python exception)."""
        path = self.logs / f"{sid}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        errors = [ln for ln in lines if re.match(r"(error:|[A-Za-z_.]*(Error|Exception)\b)", ln)]
        return errors[-1] if errors else None

    # ------------------------------------------------------------------ data, training
    def data(self, prepared: str | None, cap_s: float) -> Path | None:
        """The prepared corpus (``prepared``, else the kit's), or one built here as the ``data`` step."""
        folder = Path(prepared) if prepared else self.kit / "data"
        if gpu_env.prepared_data(folder):
            self.runner.log(f"data: the prepared corpus {folder} (corpus.bin/.idx, tokenizer/)")
            self.runner.record("data", "ok", 0, 0, 0, f"prepared: {folder}")
            return folder
        folder = self.work / "data"
        corpus = SMOKE_CORPUS if self.smoke else DEVICE_CORPUS
        workers = "1" if self.smoke else "8"
        show = "; ".join(" ".join(c[1:]) for c in gpu_env.data_commands(folder, self.work, int(workers), corpus))
        ok = self.runner.step("data", cap_s, [self.python, "-m", "megatron_loop.gpu.env", "data", str(folder),
                                              str(self.work), workers, *corpus], show=show, env=self.env)
        return folder if ok and gpu_env.prepared_data(folder) else None

    def train_command(self, run: str, config: str, data: Path, micro: int, accumulation: int, steps: int,
                      sets: list[str], save_interval: int = 1_000_000) -> list[str]:
        """The shipped ``config`` through the deepspeed launcher on ``data``, a fixed number of steps, no
        final checkpoint, global batch = micro-batch x accumulation (fp32 gradient accumulation runs)."""
        overrides = [*(SMOKE_MODEL if self.smoke else []), f"train.micro_batch_size={micro}",
                     f"train.global_batch_size={micro * accumulation}", f"train.max_steps={steps}",
                     "train.train_tokens=null", "train.save_final=false", f"train.save_interval={save_interval}",
                     "train.eval_interval=0", "train.log_interval=1", f"train.output_dir={self.work}/runs/{run}",
                     f"data.train_prefixes=[{data}/corpus]", "data.valid_prefixes=[]",
                     f"data.tokenizer={data}/tokenizer", "logging.wandb_project=null", "logging.progress_bar=false",
                     *sets]
        # found on the steps' PATH (Popen searches env's): the kit's launcher on the device
        return ["deepspeed", "--num_gpus", "1", "--master_port", str(free_port()), "pretrain_loop.py", "--config",
                config, *[a for o in overrides for a in ("--set", o)]]
