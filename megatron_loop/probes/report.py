"""The probe entry points: run, summarise, write ``geometry.json`` and the figures; or redraw the
summaries and figures of an existing ``geometry.json`` without the model."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from megatron_loop.atomic import write_atomic
from megatron_loop.cli import read_tool_json
from megatron_loop.eval.one_pass import SweepPasses
from megatron_loop.probes import plots
from megatron_loop.probes.runner import GeometryProbe, ProbeSettings
from megatron_loop.probes.sampling import ProbeSample
from megatron_loop.probes.summaries import LagSet, add_summaries, compare_reports

JSON_NAME = "geometry.json"
TRAJECTORY_PNG = plots.TRAJECTORY_PNG
INTERACTION_PNG = plots.INTERACTION_PNG


def summarise(report: dict, lag_sets: Sequence[LagSet] | None = None, reference: dict | None = None) -> dict:
    """Adds the lag-set, block-pair and terminal-response summaries and, with ``reference`` (another
    configuration's report, e.g. the double H+T when probing the triple I+H+T), the comparison:
    percent differences, ratios, R(d) and per-block-pair ratios. The reference is summarised over
    the same lag sets first, so an older report without some summary still compares."""
    used = add_summaries(report, lag_sets)
    if reference is not None:
        add_summaries(reference, used)
        report["comparison"] = compare_reports(report, reference)
        report["comparison_reference"] = plots.model_name(reference)  # B, named on the comparison figure
    return report


def write_report(report: dict, output_dir: str | Path) -> dict:
    """``geometry.json`` next to the PNG figures it lists under ``files``."""
    out = Path(output_dir)
    report["files"] = [p.name for p in plots.write_figures(report, out)]
    write_atomic(out / JSON_NAME, json.dumps(report, indent=1))
    return report


def _conditioning(config) -> str:
    """The model's conditioning in the paper's notation (``H(channel, w=2)+LG``), for the figures' label;
    the training config and the export's config name the fields alike."""
    from megatron_loop.config.naming import conditioning_notation

    return conditioning_notation(getattr(config, "initial_injection", "none"), getattr(config, "history_injection", "none"),
                                 getattr(config, "history_window", 1), getattr(config, "timestep", "none"),
                                 getattr(config, "injection_init_noise", 0.0) or 0.0)


def probe_geometry(model: torch.nn.Module, sample: ProbeSample, settings: ProbeSettings,
                   output_dir: str | Path | None = None, lag_sets: Sequence[LagSet] | None = None,
                   reference: dict | None = None, label: str | None = None,
                   on_passes: Callable[[SweepPasses], None] | None = None) -> dict:
    """All App. C.4 metrics of ``model`` on ``sample`` at ``settings.loops``.

    ``lag_sets`` default to the common cross-loop ranges (see ``summaries.default_lag_sets``);
    ``reference`` is another configuration's report (see :func:`summarise`). With ``output_dir``
    the report is written as ``geometry.json`` next to the PNG figures. ``label`` names the model
    on the figures (with its layout). ``on_passes`` is told, before the model runs, whether one pass
    serves every loop count (``runner.probe_passes``; also in the report's ``sweep_passes``).
    """
    report = {"label": label, "conditioning": _conditioning(model.config),
              **GeometryProbe(model, sample, settings).run(on_passes)}
    report = summarise(report, lag_sets, reference)
    return write_report(report, output_dir) if output_dir is not None else report


def read_report(path: str | Path, flag: str) -> dict:
    """A ``geometry.json`` (or its folder) given as ``flag``, with one-line errors for a path that is not one."""
    return read_tool_json(path, flag, JSON_NAME, "tools/probe_geometry.py",
                          ("loops", "train_loops", "layout", "sampling"))


def replot(path: str | Path, output_dir: str | Path, lag_sets: Sequence[LagSet] | None = None,
           reference: dict | None = None, label: str | None = None) -> dict:
    """Recompute the summaries of an existing report (and its comparison, given ``reference``; else
    the stored one is kept) and redraw every figure into ``output_dir``, without the model or data;
    ``label`` renames the model."""
    report = read_report(path, "--replot")
    if label:
        report["label"] = label
    return write_report(summarise(report, lag_sets, reference), output_dir)
