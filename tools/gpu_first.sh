#!/usr/bin/env bash
# The first GPU session in one command (megatron_loop/gpu/first.py says what it runs and writes):
#   bash tools/gpu_first.sh "$OUT"            # the device (one H100/H200; carry .gpu: tools/gpu_wheels.sh)
#   bash tools/gpu_first.sh OUT_DIR --smoke   # CPU, tiny sizes, the same steps
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 exec "${PYTHON:-python3}" -m megatron_loop.gpu first "$@"
