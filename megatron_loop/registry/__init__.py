"""Registry of the paper's runs and studies: every model the paper trains, by name.

One entry (:class:`Run`) per trained model: backbone family, layout ``p+s×K+c``, conditioning,
the parameter count the paper reports for its layout (where it reports one) and any note on
how an ambiguous passage was read. One :class:`Study` per figure or table: the runs behind it,
how far its loop sweep goes, whether it needs the geometry probes, and its toy-scale CPU twin.
A run's paper references are the studies that contain it (one source of truth).

Citations follow the paper's LaTeX source (``../shared/seed/``): appendices C.1-C.4
(settings), D.1-D.6 (full results), E.1-E.2 (further analysis); Tables 1-12; Figs. 1-23.

The modules, data first:
  * :mod:`.recipes`: the backbone families, their recipes (App. C.2, Table 3) and the execution
    settings of every generated file (:data:`EXECUTION`, the one place to change micro-batch,
    recomputation, compilation or the DeepSpeed config).
  * :mod:`.architectures`: :class:`Conditioning` and :class:`Run`, the paper's parameter counts.
  * :mod:`.runs` and :mod:`.pilot`: every run (:data:`RUNS`); :mod:`.studies`: every study.
  * :mod:`.sweeps`: the loop counts each run is evaluated and probed at (Sec. 2.2 (iii)).
  * :mod:`.render`: the YAML text; :mod:`.example_files`: where each file lives under examples/
    and the index ``examples/paper/README.md``; :mod:`.listing`: ``--list-configs``.

What is generated from here (never written by hand):
  * every run's config (``examples/llama_4x5.yaml``, ``examples/qwen_4x7.yaml``, the others under
    ``examples/paper/<family>/<experiment>/``) and their index: ``python tools/generate_configs.py``
    (``--check`` in the tests).
  * ``python pretrain_loop.py --list-configs``: every run with layout, parameters and paper refs.
  * ``bash tools/small_study.sh STUDY``: the toy twin of a study, trained, exported and swept.
  * ``python tools/generate_configs.py --study STUDY --commands``: the paper-scale commands.
"""

from __future__ import annotations

from megatron_loop.registry.architectures import (
    NO_CONDITIONING, PAPER_PARAMETER_COUNTS, Conditioning, Layout, Run, baseloop_layout, make_run,
)
from megatron_loop.registry.example_files import (
    EXAMPLES, HEADLINE_RUNS, INDEX, PAPER_EXAMPLES, example_path, experiment_folder, generated_files, index_text,
)
from megatron_loop.registry.listing import list_configs, parameter_counts
from megatron_loop.registry.pilot import PILOT_ASSUMPTIONS, PILOT_BUDGET, PILOT_NOTE, is_pilot
from megatron_loop.registry.recipes import DATA_PARALLEL, EXECUTION, FAMILIES, TOY_TRAIN, Family
from megatron_loop.registry.render import (
    GENERATED_NOTE, dump_yaml, render_run, render_toy, run_config, toy_config, toy_copies,
)
from megatron_loop.registry.runs import INITIAL, RUNS, TIMESTEP, WINDOWS
from megatron_loop.registry.studies import STUDIES, STUDY_LIST, Study, ToyRun, paper_refs
from megatron_loop.registry.sweeps import (
    loops_for_depth, matched_depths, probe_loops, run_depth_multiple, sweep_loops, sweep_summary,
)

__all__ = [
    "NO_CONDITIONING", "PAPER_PARAMETER_COUNTS", "Conditioning", "Layout", "Run", "baseloop_layout", "make_run",
    "EXAMPLES", "HEADLINE_RUNS", "INDEX", "PAPER_EXAMPLES", "example_path", "experiment_folder", "generated_files",
    "index_text", "list_configs", "parameter_counts", "PILOT_ASSUMPTIONS", "PILOT_BUDGET", "PILOT_NOTE", "is_pilot",
    "DATA_PARALLEL", "EXECUTION", "FAMILIES", "TOY_TRAIN", "Family", "GENERATED_NOTE", "dump_yaml", "render_run",
    "render_toy", "run_config", "toy_config", "toy_copies", "INITIAL", "RUNS", "TIMESTEP", "WINDOWS", "STUDIES",
    "STUDY_LIST", "Study", "ToyRun", "paper_refs", "loops_for_depth", "matched_depths", "probe_loops",
    "run_depth_multiple", "sweep_loops", "sweep_summary",
]
