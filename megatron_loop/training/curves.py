"""Training curves from ``metrics.jsonl`` (``tools/plot_metrics.py``): loss, learning rate, gradient
norm, throughput and MFU against step or tokens (millions), several runs on one figure
(matplotlib, Agg backend, PNG).

Each run is a ``train.output_dir`` (or its ``metrics.jsonl``), named after its run folder (the
pipeline's ``runs/NAME/train`` is NAME); its ``train`` records give the curves and its ``eval``
records the held-out loss per loop count r (markers on the loss panel, one marker shape per r,
the run's colour). The loss panel has a log y axis: the first steps sit near ln|V| and would
otherwise flatten the rest of the run. The legend has a panel of its own, so it covers no curve.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from megatron_loop.atomic import atomic_path
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.training.metrics import METRICS_NAME, read_records

X_AXES = {"step": "step", "tokens": "tokens (M)"}
FIGURE_FORMATS = (".png", ".pdf", ".svg")
MARKERS = "osD^v<>ph*"


@dataclass
class RunCurves:
    label: str
    path: Path
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    dynamics: list[dict] = field(default_factory=list)  # training/dynamics.py records


def read_run(path: str | os.PathLike, label: str | None = None) -> RunCurves:
    """The ``train`` and ``eval`` records of a run folder or a ``metrics.jsonl`` file."""
    p = Path(path)
    file = p / METRICS_NAME if p.is_dir() else p
    if not file.is_file():
        raise LoopDataError(f"{p}: no {METRICS_NAME}; expected a run folder (train.output_dir) or its "
                            f"{METRICS_NAME}")
    from megatron_loop.plotting import run_name  # matplotlib: reading metrics must not load it

    run = RunCurves(label or run_name(file.parent), file)
    for _, record in read_records(file):
        if record.get("event") == "train":
            run.train.append(record)
        elif record.get("event") == "eval":
            run.evals.append(record)
        elif record.get("event") == "dynamics":
            run.dynamics.append(record)
    if not run.train:
        raise LoopDataError(f"{file}: no training steps recorded; expected 'train' records written by "
                            "pretrain_loop.py")
    return run


def _x(record: dict, x: str, tokens_per_step: float | None) -> float:
    if x == "step":
        return record["step"]
    return (record["tokens"] if "tokens" in record else record["step"] * (tokens_per_step or 0)) / 1e6


def plot_runs(runs: list[RunCurves], x: str = "step"):
    """A figure with five panels over ``x`` (loss with validation markers, learning rate, gradient
    norm, throughput, MFU) and a sixth holding the legend."""
    if x not in X_AXES:
        raise LoopConfigError(f"--x {x!r}: expected one of {sorted(X_AXES)}")
    import matplotlib.pyplot as plt

    from megatron_loop import plotting  # matplotlib, as above

    fig, grid = plt.subplots(2, 3, figsize=(15, 7.5))
    loss_ax, lr_ax, grad_ax, speed_ax, mfu_ax, legend_ax = grid.flat
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        per_token = (run.train[-1]["tokens"] / run.train[-1]["step"]) if "tokens" in run.train[-1] else None
        xs = [_x(r, x, per_token) for r in run.train]
        loss_ax.plot(xs, [r["loss"] for r in run.train], color=color, linewidth=1, label=f"{run.label}: training loss")
        loops = sorted({int(k[len("val_loss_r"):]) for e in run.evals for k in e if k.startswith("val_loss_r")})
        for j, r in enumerate(loops):
            pts = [(_x(e, x, per_token), e[f"val_loss_r{r}"]) for e in run.evals if f"val_loss_r{r}" in e]
            loss_ax.plot(*zip(*pts), color=color, linestyle="--", marker=MARKERS[j % len(MARKERS)],
                         label=f"{run.label}: validation loss at r = {r}")
        muon, adamw = ([r.get(k, math.nan) for r in run.train] for k in ("lr_muon", "lr_adamw"))
        # one schedule drives both groups (App. C.2); draw AdamW's only where it differs
        split = any(a != m for a, m in zip(adamw, muon) if not (math.isnan(a) and math.isnan(m)))
        lr_ax.plot(xs, muon, color=color, label=f"{run.label}: " + ("Muon learning rate" if split else
                                                                     "learning rate (Muon = AdamW)"))
        if split:
            lr_ax.plot(xs, adamw, color=color, linestyle=":", label=f"{run.label}: AdamW learning rate")
        for ax, key, scale in ((grad_ax, "grad_norm", 1), (speed_ax, "tokens_per_s", 1), (mfu_ax, "mfu", 100)):
            ax.plot(xs, [scale * _nan(r.get(key)) for r in run.train], color=color, linewidth=1)
    panels = ((loss_ax, "Loss (log scale)", "cross-entropy (nats / token)"),
              (lr_ax, "Learning rate", "learning rate"),
              (grad_ax, "Gradient norm (log scale)", "global L2 norm, before clipping"),
              (speed_ax, "Throughput", "tokens / s (all ranks)"),
              (mfu_ax, "Model FLOPs utilisation", "MFU (%)"))
    for ax, title, ylabel in panels:
        ax.set_title(title)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    plotting.log_y(loss_ax)
    if any(line.get_ydata().size and min(line.get_ydata()) > 0 for line in grad_ax.get_lines()):
        plotting.log_y(grad_ax)
    legend_ax.axis("off")
    handles = {}
    for ax in (loss_ax, lr_ax):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    legend_ax.legend(list(handles.values()), list(handles.keys()), loc="upper left", fontsize=8,
                     title="colour = run")
    fig.tight_layout()
    return fig


DYNAMICS_PANELS = (  # (key prefix, title, y label, log y)
    ("relative_update_l", "Relative update per loop l", "||h_l - h_(l-1)|| / ||h_(l-1)||", True),
    ("state_norm_l", "State norm per loop l (l = 0: Prelude output)", "per-token RMS of h_l", False),
    ("batch_loss_r", "Held-out batch loss at r = K - 1, K, K + 1", "cross-entropy (nats / token)", False),
    ("gate", "Timestep gates per loop l (at r = K)", "gate value g_l", False),
)


def _series(records: list[dict], prefix: str) -> dict[str, list[tuple[float, float]]]:
    """Every key of ``records`` that starts with ``prefix`` (``gate``: any gate) -> its points."""
    keys = sorted({k for r in records for k in r
                   if (k.startswith(prefix) if prefix != "gate" else "_gate_l" in k or k.startswith("adaln_scale"))},
                  key=lambda k: (k.rstrip("0123456789"), int(k[len(k.rstrip("0123456789")):])))
    return {k: [(r["step"], r[k]) for r in records if k in r] for k in keys}


def _dynamics_label(key: str) -> str:
    """``batch_loss_r3`` -> ``r = 3``; ``relative_update_l2`` -> ``relative update l = 2``."""
    if key.startswith("batch_loss_r"):
        return f"r = {key[len('batch_loss_r'):]}"
    name, _, loop = key.rpartition("_l")
    return f"{name.replace('_', ' ')} l = {loop}"


def plot_dynamics(runs: list[RunCurves]):
    """The loop dynamics of ``training/dynamics.py`` over steps: one colour per loop l (or r), one
    line style per run; ``None`` when no run recorded any (``logging.dynamics_interval``)."""
    runs = [run for run in runs if run.dynamics]
    if not runs:
        return None
    import matplotlib.pyplot as plt

    from megatron_loop import plotting  # matplotlib, as above

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    styles = ("-", "--", ":", "-.")
    cmap = plt.get_cmap("viridis")
    for ax, (prefix, title, ylabel, log) in zip(axes.flat, DYNAMICS_PANELS):
        for i, run in enumerate(runs):
            series = _series(run.dynamics, prefix)
            for j, (key, pts) in enumerate(series.items()):
                name = _dynamics_label(key)
                ax.plot(*zip(*pts), color=cmap(j / max(len(series) - 1, 1)), linestyle=styles[i % len(styles)],
                        marker=".", label=f"{run.label}: {name}" if len(runs) > 1 else name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7, ncol=2)
            if log and all(min(line.get_ydata()) > 0 for line in ax.get_lines()):
                plotting.log_y(ax)
        else:
            ax.text(0.5, 0.5, "not recorded (no timestep conditioning)" if prefix == "gate" else "not recorded",
                    ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def _nan(value) -> float:
    return math.nan if value is None else value


def save_figure(fig, output: str | os.PathLike) -> Path:
    """Write the figure (PNG, or PDF / SVG for papers: matplotlib picks the format from the suffix)
    through a temporary file in the same folder (nothing half-written)."""
    out = Path(output)
    if out.suffix.lower() not in FIGURE_FORMATS:
        raise LoopConfigError(f"--output {str(out)!r}: expected a .png, .pdf or .svg file")
    with atomic_path(out) as tmp:  # created by savefig, with the user's umask
        fig.savefig(tmp, dpi=120)
    return out
