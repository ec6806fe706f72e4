"""The modes of ``tools/bench.py``, one module each, and what they share.

``harness`` (where and at what size a run measures, the one timing helper), ``models`` (the model
and optimizer builders), ``synthetic`` (random tokens, a random-token dataset, the generated
corpus), ``rendering`` (a run's tables and provenance), ``tables`` (the torch-free helpers the
runs and the GPU reports share: the markdown table, the metrics.jsonl summary, device and commit),
``report_inputs`` / ``report_sections`` (the GPU reports, written by ``tools/bench_report.py``).
``tools/bench.py`` parses the command line and imports only the modules of the modes it runs
(``MODES`` there).

This package lives in ``tools/``, not in ``megatron_loop``: it drives the library from above
(training loop, HF export, HF transformers' own models as peers); nothing in the library imports it.
"""
