"""The GPU sessions, run by ``bash tools/gpu_first.sh`` and ``bash tools/gpu_report.sh`` on the device
(and at tiny sizes on CPU with ``--smoke``): a small driver of steps under process-tree time limits
(:mod:`.steps`), the device's environment (:mod:`.env`: the kit's wheels, the preamble, the data), the
two sessions (:mod:`.first`, :mod:`.second`, on :mod:`.session`) and their markdown reports
(:mod:`.report_inputs`, :mod:`.report_sections`, over :mod:`.tables`, which ``tools/bench.py`` renders
with too). Only the standard library at import time: the driver runs before the kit is installed.

    python -m megatron_loop.gpu first OUT_DIR [--smoke]
    python -m megatron_loop.gpu report OUT_DIR [--smoke]
"""
