"""The table ``pretrain_loop.py --list-configs`` prints: every run's name and YAML file, and with
``--details`` its layout, parameter count, loop sweep and the paper figures and tables it belongs to."""

from __future__ import annotations

from typing import Any

from megatron_loop.config import build_model_config
from megatron_loop.plan import count_parameters
from megatron_loop.registry.example_files import EXAMPLES, HEADLINE_RUNS, INDEX, PAPER_EXAMPLES, example_path
from megatron_loop.registry.pilot import PILOT_ASSUMPTIONS, PILOT_BUDGET, is_pilot
from megatron_loop.registry.runs import RUNS
from megatron_loop.registry.studies import STUDIES, STUDY_LIST, paper_refs
from megatron_loop.registry.sweeps import run_depth_multiple, sweep_summary


def parameter_counts(model_fields: dict[str, Any]) -> tuple[int, int]:
    """(all trainable parameters, backbone parameters without conditioning) of a model section:
    the dry run's count, the one call site (an analytic count can replace it here)."""
    return count_parameters(build_model_config(model_fields))


def list_configs(details: bool = False) -> str:
    """The table ``pretrain_loop.py --list-configs`` prints: each run's name and YAML file; with
    ``details`` (``--list-configs --details``) also its family, kind, layout, depths, conditioning,
    parameter count, loop sweep and the paper figures and tables it belongs to."""
    header = ("name", "config")
    more = ("family", "kind", "layout", "L_phys", "L(K)", "conditioning", "params", "loop sweep", "paper")
    rows = [header + (more if details else ())]
    for run in RUNS.values():
        row = (run.name, str(example_path(run.name)))
        if details:
            params, _ = parameter_counts(run.model_fields())
            row += (run.recipe.label, run.kind, f"{run.prelude}+{run.core}x{run.loops}+{run.coda}",
                    str(run.physical_depth), str(run.effective_depth), run.conditioning.label, f"{params:,}",
                    sweep_summary(run.layout_tuple, run_depth_multiple(run.name)),
                    (", ".join(paper_refs(run.name)) or "— (" + ", ".join(
                        s.name for s in STUDY_LIST if run.name in s.runs) + ")")
                    + (" (assumed recipe*)" if is_pilot(run) else ""))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    figures = {ref for run in RUNS for ref in paper_refs(run)}
    if details:
        lines.append("* optimizer pilot (App. D.1 gives no recipe): " + "; ".join(
            f"{section}.{key} {note.removeprefix('assumed: ').removeprefix('assumed ')}"
            for (section, key), note in PILOT_ASSUMPTIONS.items() if note.startswith("assumed"))
            + f"; budget: {PILOT_BUDGET}")
        lines.append("loop sweep: r swept at inference and the r at which L(r) = p + r·s + c reaches each matched "
                     "depth D (Sec. 2.2 (iii)); L is shown where it overshoots D")
    else:
        lines.append("each run's family, layout, depths, conditioning, parameters, loop sweep and paper figures: "
                     "python pretrain_loop.py --list-configs --details")
    lines.append(f"config files: {', '.join(f'{EXAMPLES}/{name}.yaml' for name in HEADLINE_RUNS)}; the others under "
                 f"{PAPER_EXAMPLES}/, indexed in {INDEX}")
    lines.append(f"{len(RUNS)} runs behind {len(figures)} paper figures/tables; studies: {', '.join(STUDIES)} "
                 "(bash tools/small_study.sh STUDY)")
    return "\n".join(lines)
