"""The probe entry point taking a model: run, summarise, write ``geometry.json`` and the figures."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from megatron_loop.probes import plots
from megatron_loop.probes.runner import GeometryProbe, ProbeSettings
from megatron_loop.probes.sampling import ProbeSample
from megatron_loop.probes.summaries import LagSet, add_summaries, compare_reports

JSON_NAME = "geometry.json"
TRAJECTORY_PNG = "geometry_trajectory.png"
INTERACTION_PNG = "geometry_interaction.png"


def probe_geometry(model: torch.nn.Module, sample: ProbeSample, settings: ProbeSettings,
                   output_dir: str | Path | None = None, lag_sets: Sequence[LagSet] | None = None,
                   reference: dict | None = None) -> dict:
    """All App. A.4 metrics of ``model`` on ``sample`` at ``settings.loops``.

    ``lag_sets`` default to the common cross-loop ranges (see ``summaries.default_lag_sets``);
    ``reference`` is another configuration's report (e.g. the double H+T when probing the triple
    I+H+T): percent differences and R(d) are added under ``comparison``. With ``output_dir`` the
    report is written as ``geometry.json`` next to the PNG figures it lists under ``files``.
    """
    report = GeometryProbe(model, sample, settings).run()
    add_summaries(report, lag_sets)
    if reference is not None:
        report["comparison"] = compare_reports(report, reference)
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = [plots.plot_trajectory(report, out / TRAJECTORY_PNG),
                 plots.plot_interaction(report, out / INTERACTION_PNG)]
        report["files"] = [p.name for p in files if p is not None]
        (out / JSON_NAME).write_text(json.dumps(report, indent=1))
    return report
