#!/usr/bin/env bash
# The second GPU session: every GPU target the first leaves, in one report (megatron_loop/gpu/second.py):
#   bash tools/gpu_report.sh OUT_DIR           # one H100/H200 (carry .gpu: tools/gpu_wheels.sh)
#   bash tools/gpu_report.sh OUT_DIR --smoke   # CPU, tiny sizes, the same steps
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 exec "${PYTHON:-python3}" -m megatron_loop.gpu report "$@"
