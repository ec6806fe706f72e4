"""The GPU device's environment: the wheel kit of ``tools/gpu_wheels.sh`` installed where Python finds
it, the preamble that proves the training path imports before any GPU time is spent on it, and the
data the training runs read.

    python -m megatron_loop.gpu.env install [KIT] [--site DIR]  # KIT/whl (default .gpu/whl) into DIR (/tmp/site)
    python -m megatron_loop.gpu.env exports [--site DIR]        # the export line (eval "$(...)": device_env.sh)
    python -m megatron_loop.gpu.env check [--cuda]              # the preamble: real imports, versions, free disk
    python -m megatron_loop.gpu.env data DATA SCRATCH WORKERS [make_corpus args]   # corpus -> tokenizer -> dataset

install: ``python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target
SITE KIT/whl/*.whl``, pip's own errors shown; exit 1 naming the kit and pip's exit code.
GPU_ENV_PIP_ARGS adds arguments (a CPU rehearsal of the kit: the cp312 tags).

check: imports, one by one and for real (``importlib.import_module``, not ``find_spec``), torch,
triton, deepspeed, megatron.core, transformers, the Liger kernel module that
``megatron_loop/model/loss.py`` calls and megatron_loop's training path; prints each one's version,
place and import time. The first import that raises ends the check with exit code 1 and, last, the
line ``error: import MODULE failed: TYPE: MESSAGE``. With --cuda it also requires a CUDA device that
torch and DeepSpeed both see and prints nvidia-smi's view of it; it always prints the free disk.
Only the standard library is imported at module level: this runs before the kit is installed.
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SITE = "/tmp/site"
MODULES = ("torch", "triton", "deepspeed", "megatron.core", "transformers", "liger_kernel.ops.cross_entropy",
           "megatron_loop.model.loss", "megatron_loop.training")
DISTS = {"megatron": "megatron-core", "liger_kernel": "liger_kernel"}


def install(kit: Path, site: Path) -> int:
    """The wheels of ``kit``/whl into ``site``; 0, or 1 with pip's errors above the last line."""
    wheels = sorted((kit / "whl").glob("*.whl"))
    if not wheels:
        print(f"error: {kit}/whl: no wheels; make the kit on the CPU machine with 'bash tools/gpu_wheels.sh' "
              "and carry .gpu", file=sys.stderr)
        return 1
    print(f"installing {len(wheels)} wheels of {kit}/whl into {site}", flush=True)
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", str(site),
                          *shlex.split(os.environ.get("GPU_ENV_PIP_ARGS", "")), *map(str, wheels)])
    if rc != 0:
        print(f"error: pip install of {kit}/whl into {site} failed (pip exit code {rc}; its errors are above)",
              file=sys.stderr)
        return 1
    print("installed: " + " ".join(sorted(p.name[: -len(".dist-info")] for p in site.glob("*.dist-info"))))
    return 0


def environment(site: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every device step runs in: the kit's folder and the repository first on the path."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH")
    env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}" + (f"{os.pathsep}{path}" if path else ""),
               PATH=f"{site / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    return env


def exports(site: Path) -> str:
    """:func:`environment`'s additions as one shell line (``source .gpu/device_env.sh``)."""
    env = environment(site)
    keys = ("PYTHONPATH", "PATH", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "WANDB_MODE",
            "TOKENIZERS_PARALLELISM")
    return "export " + " ".join(f"{k}={shlex.quote(env[k])}" for k in keys)


def _version(name: str) -> str:
    top = name.split(".")[0]
    found = getattr(sys.modules.get(top), "__version__", None)
    if found:
        return str(found)
    try:
        return metadata.version(DISTS.get(top, top))
    except metadata.PackageNotFoundError:
        return "?"


def _fail(what: str, exc: BaseException) -> int:
    traceback.print_exc()
    message = str(exc).strip()
    print(f"error: {what} failed: {type(exc).__name__}: {message.splitlines()[0] if message else ''}", flush=True)
    return 1


def check(cuda: bool) -> int:
    """The preamble; 0, or 1 with the failed import named on the last line."""
    print(f"python: {sys.executable} ({sys.version.split()[0]})")
    print(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    if cuda:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                              "--format=csv"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        if smi is None or smi.returncode != 0:
            print("error: nvidia-smi failed: no GPU visible", flush=True)
            return 1
        print(smi.stdout, end="")
    for where in dict.fromkeys(("/tmp", str(ROOT))):
        usage = shutil.disk_usage(where)
        print(f"disk {where}: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB", flush=True)
    start = time.perf_counter()
    for name in MODULES:
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - any import-time failure, SystemExit included, ends the check
            return _fail(f"import {name}", e)
        where = os.path.dirname(getattr(module, "__file__", "") or "?")
        print(f"import {name}: ok, version {_version(name)}, {time.perf_counter() - t0:.1f} s, from {where}",
              flush=True)
    try:
        import torch
        from deepspeed.accelerator import get_accelerator

        from megatron_loop.model.loss import liger_cross_entropy_kernel

        liger_cross_entropy_kernel()  # what loss_implementation=fused calls
        accelerator = get_accelerator().device_name()
        print(f"deepspeed accelerator: {accelerator}; torch.cuda.is_available(): {torch.cuda.is_available()}",
              flush=True)
        if cuda:
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
            if accelerator != "cuda":
                raise RuntimeError(f"DeepSpeed chose the {accelerator!r} accelerator, not cuda")
            props = torch.cuda.get_device_properties(0)
            print(f"device: {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
                  f"{props.major}.{props.minor}, {props.multi_processor_count} SMs; CUDA {torch.version.cuda}",
                  flush=True)
    except BaseException as e:  # noqa: BLE001
        return _fail("device check", e)
    print(f"preamble: ok ({time.perf_counter() - start:.1f} s of imports)", flush=True)
    return 0


def prepared_data(folder: Path) -> bool:
    """Whether ``folder`` holds the layout the training runs read: corpus.bin/.idx and tokenizer/."""
    return all((folder / f).is_file() for f in ("corpus.idx", "corpus.bin", "tokenizer/tokenizer.json"))


def data_commands(data: Path, scratch: Path, workers: int, corpus: list[str]) -> list[list[str]]:
    """Generated corpus (SCRATCH/corpus) -> byte-level BPE tokenizer trained on it (DATA/tokenizer, 2048 ids)
    -> indexed dataset DATA/corpus.{bin,idx}: the layout tools/gpu_wheels.sh carries in .gpu/data."""
    py = os.environ.get("PYTHON", sys.executable)
    return [[py, "tools/make_corpus.py", "--output-dir", f"{scratch}/corpus", "--seed", "0", *corpus],
            [py, "tools/train_tokenizer.py", "--input", f"{scratch}/corpus/train.jsonl", "--output",
             f"{data}/tokenizer", "--vocab-size", "2048"],
            [py, "tools/preprocess_data.py", "--input", f"{scratch}/corpus/train.jsonl", "--tokenizer",
             f"{data}/tokenizer", "--output-prefix", f"{data}/corpus", "--workers", str(workers), "--no-progress"]]


def build_data(data: Path, scratch: Path, workers: int, corpus: list[str]) -> int:
    for command in data_commands(data, scratch, workers, corpus):
        rc = subprocess.call(command, cwd=ROOT)
        if rc != 0:
            return rc
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    verb, rest = (args[0], args[1:]) if args else ("", [])
    site = Path(os.environ.get("GPU_SITE", DEFAULT_SITE))
    if "--site" in rest:
        i = rest.index("--site")
        site, rest = Path(rest[i + 1]), rest[:i] + rest[i + 2:]
    if verb == "install" and len(rest) <= 1:
        return install(Path(rest[0]) if rest else ROOT / ".gpu", site)
    if verb == "exports" and not rest:
        print(exports(site))
        return 0
    if verb == "check" and rest in ([], ["--cuda"]):
        return check(cuda=bool(rest))
    if verb == "data" and len(rest) >= 3 and rest[2].isdigit():
        return build_data(Path(rest[0]), Path(rest[1]), int(rest[2]), rest[3:])
    print("error: usage: python -m megatron_loop.gpu.env install [KIT] [--site DIR] | exports [--site DIR] | "
          "check [--cuda] | data DATA SCRATCH WORKERS [make_corpus args]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
