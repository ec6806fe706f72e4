"""The modes of ``tools/bench.py``, one module each, and what they share.

``harness`` (where and at what size a run measures, the one timing helper), ``models`` (the model
and optimizer builders), ``synthetic`` (random tokens, a random-token dataset, the generated
corpus), ``rendering`` (the markdown table and the run's provenance). ``tools/bench.py`` parses
the command line and imports only the modules of the modes it runs (``MODES`` there).

This package lives in ``tools/``, not in ``megatron_loop``: it drives the library from above
(training loop, HF export, HF transformers' own models as peers) and shares the report helpers
of ``tools/bench_report.py``; nothing in the library imports it.
"""
