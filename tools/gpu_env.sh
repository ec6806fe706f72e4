#!/usr/bin/env bash
# The GPU device's environment: the wheel kit of tools/gpu_wheels.sh installed where Python finds it,
# and the preamble that proves the training path imports, before any GPU time is spent on it.
#
#   source tools/gpu_env.sh [KIT]         # install KIT/whl (default .gpu/whl) into $GPU_SITE (/tmp/site)
#                                         # and export PYTHONPATH, PATH and the offline settings
#   bash tools/gpu_env.sh install [KIT]   # the install alone (a step of tools/gpu_first.sh)
#   bash tools/gpu_env.sh exports         # print the export line (eval "$(bash tools/gpu_env.sh exports)")
#   bash tools/gpu_env.sh check [--cuda]  # the preamble: real imports, versions, nvidia-smi, free disk
#
# install: `python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target
# $GPU_SITE KIT/whl/*.whl`, pip's own errors shown (never sent to /dev/null); exit 1 naming the kit
# and pip's exit code. GPU_ENV_PIP_ARGS adds arguments (a CPU rehearsal of the kit: the cp312 tags).
#
# check: imports, one by one and for real (not importlib.util.find_spec, which imports nothing),
# torch, triton, deepspeed, megatron.core, transformers, the Liger kernel module that
# megatron_loop/model/loss.py calls (liger_kernel.ops.cross_entropy) and megatron_loop's training
# path; prints each one's version, place and import time. The first import that raises ends the
# check at once with exit code 1 and, last, the line `error: import MODULE failed: TYPE: MESSAGE`
# (its traceback above it). With --cuda it also requires a CUDA device that torch and DeepSpeed
# both see and prints nvidia-smi's view of it; it always prints the free disk (df -h) of /tmp and
# of the repository.

_gpu_env_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU_SITE=${GPU_SITE:-/tmp/site}
GPU_PYTHON=${PYTHON:-python3}

gpu_env_install() {  # gpu_env_install [KIT]: the wheels of KIT/whl into $GPU_SITE
  local kit=${1:-$_gpu_env_root/.gpu} wheels
  wheels=("$kit"/whl/*.whl)
  if [ ! -e "${wheels[0]}" ]; then
    echo "error: $kit/whl: no wheels; make the kit on the CPU machine with 'bash tools/gpu_wheels.sh' and carry .gpu" >&2
    return 1
  fi
  echo "installing ${#wheels[@]} wheels of $kit/whl into $GPU_SITE"
  # shellcheck disable=SC2086
  "$GPU_PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_SITE" \
      ${GPU_ENV_PIP_ARGS:-} "${wheels[@]}"
  local rc=$?
  if [ $rc != 0 ]; then
    echo "error: pip install of $kit/whl into $GPU_SITE failed (pip exit code $rc; its errors are above)" >&2
    return 1
  fi
  echo "installed: $(cd "$GPU_SITE" && ls -d ./*.dist-info | sed 's|^\./||; s|\.dist-info$||' | tr '\n' ' ')"
}

gpu_env_exports() {  # the environment every device command runs in
  printf 'export PYTHONPATH=%q PATH=%q PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false\n' \
      "$GPU_SITE:$_gpu_env_root${PYTHONPATH:+:$PYTHONPATH}" "$GPU_SITE/bin:$PATH"
}

gpu_env_check() {  # gpu_env_check [--cuda]: the preamble
  local cuda=0
  [ "${1:-}" = --cuda ] && cuda=1
  echo "python: $(command -v "$GPU_PYTHON") ($("$GPU_PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
  echo "PYTHONPATH=${PYTHONPATH:-}"
  if [ $cuda = 1 ]; then
    if ! nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; then
      echo "error: nvidia-smi failed: no GPU visible" >&2
      return 1
    fi
  fi
  df -h /tmp "$_gpu_env_root" 2>&1 | awk '!seen[$0]++'
  GPU_ENV_CUDA=$cuda "$GPU_PYTHON" - <<'PY'
import importlib
import os
import sys
import time
import traceback
from importlib import metadata

MODULES = ["torch", "triton", "deepspeed", "megatron.core", "transformers", "liger_kernel.ops.cross_entropy",
           "megatron_loop.model.loss", "megatron_loop.training"]
DISTS = {"megatron": "megatron-core", "liger_kernel": "liger_kernel"}


def version(name):
    top = name.split(".")[0]
    module = sys.modules.get(top)
    found = getattr(module, "__version__", None)
    if found:
        return str(found)
    try:
        return metadata.version(DISTS.get(top, top))
    except metadata.PackageNotFoundError:
        return "?"


def fail(what, exc):
    traceback.print_exc()
    print(f"error: {what} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
          flush=True)
    sys.exit(1)


start = time.perf_counter()
for name in MODULES:
    t0 = time.perf_counter()
    try:
        module = importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - any import-time failure, SystemExit included, ends the check
        fail(f"import {name}", e)
    where = os.path.dirname(getattr(module, "__file__", "") or "?")
    print(f"import {name}: ok, version {version(name)}, {time.perf_counter() - t0:.1f} s, from {where}", flush=True)

try:
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from megatron_loop.model.loss import liger_cross_entropy_kernel

    liger_cross_entropy_kernel()  # what loss_implementation=fused calls
    accelerator = get_accelerator().device_name()
    print(f"deepspeed accelerator: {accelerator}; torch.cuda.is_available(): {torch.cuda.is_available()}", flush=True)
    if os.environ.get("GPU_ENV_CUDA") == "1":
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        if accelerator != "cuda":
            raise RuntimeError(f"DeepSpeed chose the {accelerator!r} accelerator, not cuda")
        props = torch.cuda.get_device_properties(0)
        print(f"device: {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
              f"{props.major}.{props.minor}, {props.multi_processor_count} SMs; CUDA {torch.version.cuda}", flush=True)
except BaseException as e:  # noqa: BLE001
    fail("device check", e)
print(f"preamble: ok ({time.perf_counter() - start:.1f} s of imports)", flush=True)
PY
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then  # sourced: install the kit and export the environment
  gpu_env_install "${1:-}" && eval "$(gpu_env_exports)"
else
  case ${1:-} in
    install) shift; gpu_env_install "$@" ;;
    exports) gpu_env_exports ;;
    check) shift; gpu_env_check "$@" ;;
    *) echo "error: usage: bash tools/gpu_env.sh install [KIT] | exports | check [--cuda]; or: source tools/gpu_env.sh [KIT]" >&2
       exit 2 ;;
  esac
fi
