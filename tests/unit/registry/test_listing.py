"""``registry/listing.py``: ``pretrain_loop.py --list-configs``'s table, one row per run with its file, and
the lines after it (the --details columns and the command line: tests/unit/registry/test_registry.py)."""

from __future__ import annotations

from megatron_loop.registry import RUNS, STUDIES
from megatron_loop.registry.example_files import example_path
from megatron_loop.registry.listing import list_configs, parameter_counts


def test_one_row_per_run_then_the_notes():
    lines = list_configs().splitlines()
    assert lines[0].split() == ["name", "config"]
    rows = lines[1:1 + len(RUNS)]
    assert [row.split() for row in rows] == [[name, str(example_path(name))] for name in RUNS]
    assert lines[-3].startswith("each run's family, layout, depths, conditioning, parameters, loop sweep")
    assert lines[-2].startswith("config files: examples/llama_4x5.yaml, examples/qwen_4x7.yaml; the others under ")
    assert lines[-1].startswith(f"{len(RUNS)} runs behind ") and lines[-1].endswith(
        f"studies: {', '.join(STUDIES)} (bash tools/small_study.sh STUDY)")
    assert len(lines) == 1 + len(RUNS) + 3


def test_parameter_counts_split_off_the_conditioning():
    plain, plain_backbone = parameter_counts(dict(backbone="tiny-qwen", core_layers=2, train_loops=3))
    assert plain == plain_backbone > 0
    gated, gated_backbone = parameter_counts(dict(backbone="tiny-qwen", core_layers=2, train_loops=3,
                                                  timestep="loop_gating"))
    assert gated_backbone == plain_backbone and gated - gated_backbone == 8  # loop gating: 8 scalars (App. C.1)
