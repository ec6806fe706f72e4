"""Training curves from ``metrics.jsonl`` (``tools/plot_metrics.py``): loss, learning rate, gradient
norm, throughput and MFU against step or tokens (millions), several runs on one figure
(matplotlib, Agg backend; PNG, PDF or SVG).

Each run is a ``train.output_dir`` (or its ``metrics.jsonl``), labelled by what it is: the label its
``start`` event recorded, ``NAME (p+sxK+c, conditioning)`` (:mod:`megatron_loop.config.naming`;
older runs: their run folder, the pipeline's ``runs/NAME/train`` is NAME). The learning rate is
drawn at every step from the schedule the start events recorded (:func:`lr_schedule`): the
``train`` records sample it every ``train.log_interval`` steps, which can miss the whole warmup.
Its ``train`` records give the curves and its ``eval``
records the held-out loss per loop count r (markers on the loss panel, one marker shape per r,
the run's colour). The loss panel has a log y axis: the first steps sit near ln|V| and would
otherwise flatten the rest of the run. The legend has a panel of its own, so it covers no curve; a
quantity no run logged (MFU on CPU) gets no panel.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from megatron_loop.atomic import atomic_path
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.training.metrics import METRICS_NAME, numbered_records

X_AXES = {"step": "step", "tokens": "tokens (M)"}
FIGURE_FORMATS = (".png", ".pdf", ".svg")
MARKERS = "osD^v<>ph*"


# Per-record fields drawn on a panel: a value there must be a number; these must not be negative
# either (a cross-entropy, a norm, a rate). NaN / Infinity stay: a skipped non-finite step is a gap.
TRAIN_FIELDS = ("loss", "lr_muon", "lr_adamw", "grad_norm", "tokens_per_s", "mfu", "tokens")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class RunCurves:
    label: str
    path: Path
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    dynamics: list[dict] = field(default_factory=list)  # training/dynamics.py records
    starts: list[dict] = field(default_factory=list)  # start events: label and lr schedule (training/banner.py)
    last_step: int = 0  # the newest step any record names
    warnings: list[str] = field(default_factory=list)  # one line per kind of skipped input


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
    return f"line{'s' if len(numbers) > 1 else ''} {shown}"


def _bad(value, non_negative: bool) -> bool:
    """Not drawable: not a number (a string, a list, a boolean) or, for ``non_negative``, below zero."""
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return non_negative and value < 0


def _read_text(file: Path) -> str:
    raw = file.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        what = "a PNG image" if raw.startswith(PNG_MAGIC) else f"not UTF-8 text ({len(raw):,} bytes)"
        raise LoopDataError(f"{file}: {what}; expected a metrics.jsonl written by pretrain_loop.py (or its run "
                            "folder)") from None


def read_run(path: str | os.PathLike, label: str | None = None) -> RunCurves:
    """The records of a run folder or a ``metrics.jsonl`` file, checked: lines that are not JSON
    records, records without a step and values that cannot be drawn (not a number, negative) are
    left out, each kind named with its line numbers in :attr:`RunCurves.warnings`; a file with no
    training step that has a finite loss is an error (nothing to draw). The run is labelled by
    ``label``, else by the label its start event recorded (name, layout, conditioning), else by its
    folder."""
    p = Path(path)
    file = p / METRICS_NAME if p.is_dir() else p
    if not file.is_file():
        raise LoopDataError(f"{p}: no {METRICS_NAME}; expected a run folder (train.output_dir) or its "
                            f"{METRICS_NAME}")
    from megatron_loop.config.naming import run_folder_name as run_name

    text = _read_text(file)
    run = RunCurves(label or "", file)
    garbage, no_step, bad = [], [], {}  # bad: (key, non-negative) -> [(line, value)]
    for number, line, record in numbered_records(text):
        if record is None:
            if line.strip():
                garbage.append(number)
            continue
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            if record.get("event") in ("train", "eval", "dynamics", "start"):
                no_step.append(number)
            continue
        run.last_step = max(run.last_step, step)
        event = record.get("event")
        if event in ("train", "eval", "dynamics"):
            keys = (TRAIN_FIELDS if event == "train" else
                    [k for k in record if k.startswith("val_loss_r")] if event == "eval" else
                    [k for k in record if k not in ("event", "step")])
            non_negative = event != "dynamics"  # dynamics: gates may be negative (AdaLN scales)
            for key in keys:
                if key in record and _bad(record[key], non_negative):
                    bad.setdefault((key, non_negative), []).append((number, record[key]))
                    record[key] = None  # not drawn; the rest of the record is
        if event == "train":
            run.train.append(record)
        elif event == "eval":
            run.evals.append(record)
        elif event == "dynamics":
            run.dynamics.append(record)
        elif event == "start":
            run.starts.append(record)
    if garbage:
        run.warnings.append(f"warning: {file}: {_lines(garbage)}: not a JSON record; skipped")
    if no_step:
        run.warnings.append(f"warning: {file}: {_lines(no_step)}: no step (expected an integer >= 0); skipped")
    for (key, non_negative), where in bad.items():
        values = ", ".join(repr(v) for _, v in where[:3]) + (", ..." if len(where) > 3 else "")
        run.warnings.append(f"warning: {file}: {_lines([n for n, _ in where])}: {key} is not a "
                            f"{'non-negative ' if non_negative else ''}number ({values}); not drawn")
    for key in TRAIN_FIELDS[1:]:  # the loss: below
        values = [r[key] for r in run.train if r.get(key) is not None]
        if values and not any(math.isfinite(v) for v in values):
            run.warnings.append(f"warning: {file}: {key} is NaN or infinite in all {len(values)} 'train' records; "
                                "its panel is empty")
    if not run.train:
        raise LoopDataError(f"{file}: no training steps recorded; expected 'train' records written by "
                            "pretrain_loop.py")
    if not any(isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]) for r in run.train):
        raise LoopDataError(f"{file}: no training step with a finite loss ({len(run.train)} 'train' records); "
                            "nothing to draw")
    recorded = run.starts[-1].get("label") if run.starts else None
    run.label = label or (recorded if isinstance(recorded, str) and recorded else run_name(file.parent))
    return run


def _x(record: dict, x: str, tokens_per_step: float | None) -> float:
    if x == "step":
        return record["step"]
    tokens = record.get("tokens")
    return (tokens if tokens is not None else record["step"] * (tokens_per_step or math.nan)) / 1e6


def lr_schedule(run: RunCurves) -> dict[str, list[tuple[int, float]]]:
    """Parameter group (``muon``, ``adamw``) -> ``(step, lr)`` at every step up to the run's newest,
    computed from the schedule each start event recorded (until the next start: a resume that
    changed the schedule starts a new segment) by the trainer's own multiplier
    (:class:`~megatron_loop.optim.schedule.WSDMultiplier`; step t runs at peak x lambda(t))."""
    from megatron_loop.optim.schedule import WSDMultiplier

    starts = sorted({s["step"]: s for s in run.starts}.items())  # the newest start event of each step
    out: dict[str, list[tuple[int, float]]] = {}
    for i, (begin, start) in enumerate(starts):
        schedule = dict(start.get("schedule") or {})
        peaks = schedule.pop("peak_lr", None)
        try:
            multiplier = WSDMultiplier(**schedule)
            points = [(t, multiplier(t - 1)) for t in range(begin + 1, (starts[i + 1][0] if i + 1 < len(starts)
                                                                         else run.last_step) + 1)]
            peaks = {str(k): float(v) for k, v in peaks.items()}
        except (TypeError, ValueError, AttributeError):  # not a schedule this version wrote
            run.warnings.append(f"warning: {run.path}: the start event of step {begin} records no schedule this "
                                "version can read; its learning rate is drawn from the logged samples only")
            return {}
        for name, peak in peaks.items():
            out.setdefault(name, []).extend((t, peak * m) for t, m in points)
    return out


def _plot_lr(ax, run: RunCurves, xs: list[float], color, x_of) -> None:
    """The learning rate at every step from the run's recorded schedule (warmup included, which the
    samples logged every ``train.log_interval`` steps would miss), the logged samples as dots on it;
    runs written before the start event: the samples alone. One schedule drives both groups (App.
    C.2): AdamW's is drawn only where it differs from Muon's."""
    schedule = lr_schedule(run)
    logged = {k: [_nan(r.get(k)) for r in run.train] for k in ("lr_muon", "lr_adamw")}
    if schedule:
        lines = {k: ([x_of(t) for t, _ in v], [lr for _, lr in v]) for k, v in schedule.items()}
        muon, adamw = lines.get("muon"), lines.get("adamw")
    else:
        muon, adamw = (xs, logged["lr_muon"]), (xs, logged["lr_adamw"])
    split = muon is not None and adamw is not None and any(
        a != m for a, m in zip(adamw[1], muon[1]) if not (math.isnan(a) and math.isnan(m)))
    every = " at every step" if schedule else ""
    first = muon if muon is not None else adamw
    ax.plot(*first, color=color, linewidth=1,
            label=f"{run.label}: " + (f"Muon learning rate{every}" if split else f"learning rate{every} (Muon = AdamW)"))
    if split:
        ax.plot(*adamw, color=color, linestyle=":", label=f"{run.label}: AdamW learning rate{every}")
    if schedule:
        ax.plot(xs, logged["lr_muon"], color=color, linestyle="none", marker=".", markersize=4,
                label=f"{run.label}: learning rate as logged (every train.log_interval steps)")


def _has_values(runs: list[RunCurves], key: str) -> bool:
    return any(isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) for run in runs for r in run.train)


def plot_runs(runs: list[RunCurves], x: str = "step"):
    """A figure with a panel per quantity over ``x`` (loss with validation markers, learning rate,
    gradient norm, throughput, and MFU where any run logged one: none on CPU without
    ``logging.peak_tflops``) and a panel holding the legend, always the last axes."""
    if x not in X_AXES:
        raise LoopConfigError(f"--x {x!r}: expected one of {sorted(X_AXES)}")
    import matplotlib.pyplot as plt

    from megatron_loop import plotting  # matplotlib, as above

    with_mfu = _has_values(runs, "mfu")  # an empty MFU panel with +-0.04 ticks says nothing
    fig = plt.figure(figsize=(15, 7.5))
    grid = fig.add_gridspec(2, 3)
    cells = [grid[0, 0], grid[0, 1], grid[0, 2], grid[1, 0], grid[1, 1]] if with_mfu else \
        [grid[0, 0], grid[0, 1], grid[1, 0], grid[1, 1]]
    axes = [fig.add_subplot(cell) for cell in cells]
    loss_ax, lr_ax, grad_ax, speed_ax = axes[:4]
    mfu_ax = axes[4] if with_mfu else None
    legend_ax = fig.add_subplot(grid[1, 2] if with_mfu else grid[:, 2])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        last = run.train[-1]
        per_token = last["tokens"] / last["step"] if last.get("tokens") is not None and last["step"] else None
        xs = [_x(r, x, per_token) for r in run.train]
        loss_ax.plot(xs, [_nan(r.get("loss")) for r in run.train], color=color, linewidth=1,
                     label=f"{run.label}: training loss")
        loops = sorted({int(k[len("val_loss_r"):]) for e in run.evals for k in e if k.startswith("val_loss_r")})
        for j, r in enumerate(loops):
            pts = [(_x(e, x, per_token), _nan(e[f"val_loss_r{r}"])) for e in run.evals if f"val_loss_r{r}" in e]
            loss_ax.plot(*zip(*pts), color=color, linestyle="--", marker=MARKERS[j % len(MARKERS)],
                         label=f"{run.label}: validation loss at r = {r}")
        _plot_lr(lr_ax, run, xs, color, lambda step: _x({"step": step}, x, per_token))
        for ax, key, scale in ((grad_ax, "grad_norm", 1), (speed_ax, "tokens_per_s", 1), (mfu_ax, "mfu", 100)):
            if ax is not None:
                ax.plot(xs, [scale * _nan(r.get(key)) for r in run.train], color=color, linewidth=1)
    panels = ((loss_ax, "Loss (log scale)", "cross-entropy (nats / token)"),
              (lr_ax, "Learning rate", "learning rate"),
              (grad_ax, "Gradient norm (log scale)", "global L2 norm, before clipping"),
              (speed_ax, "Throughput", "tokens / s (all ranks)"),
              (mfu_ax, "Model FLOPs utilisation", "MFU (%)"))
    for ax, title, ylabel in panels:
        if ax is None:
            continue
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
    return {k: pts for k in keys if (pts := [(r["step"], r[k]) for r in records if r.get(k) is not None])}


def _dynamics_label(key: str) -> str:
    """``batch_loss_r3`` -> ``r = 3``; ``relative_update_l2`` -> ``relative update l = 2``."""
    if key.startswith("batch_loss_r"):
        return f"r = {key[len('batch_loss_r'):]}"
    name, _, loop = key.rpartition("_l")
    return f"{name.replace('_', ' ')} l = {loop}"


def plot_dynamics(runs: list[RunCurves]):
    """The loop dynamics of ``training/dynamics.py`` over steps: one colour per loop l (or r), one
    line style per run, each panel's legend to its right; a panel only for what some run recorded
    (no gate panel without timestep conditioning); the step axis spans the runs' training, so a run
    with one record shows it where it fell. ``None`` when no run recorded any
    (``logging.dynamics_interval``)."""
    runs = [run for run in runs if run.dynamics]
    if not runs:
        return None
    import matplotlib.pyplot as plt

    from megatron_loop import plotting  # matplotlib, as above

    panels = [(panel, {i: _series(run.dynamics, panel[0]) for i, run in enumerate(runs)})
              for panel in DYNAMICS_PANELS]
    panels = [(panel, series) for panel, series in panels if any(series.values())]
    rows = 1 if len(panels) <= 2 else 2
    cols = math.ceil(len(panels) / rows)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 4.2 * rows), squeeze=False)
    styles = ("-", "--", ":", "-.")
    cmap = plt.get_cmap("viridis")
    horizon = max(run.last_step for run in runs)
    for ax in axes.flat[len(panels):]:  # an odd count: no empty frame left in the grid
        ax.remove()
    for ax, ((prefix, title, ylabel, log), by_run) in zip(axes.flat, panels):
        for i, run in enumerate(runs):
            series = by_run[i]
            for j, (key, pts) in enumerate(series.items()):
                name = _dynamics_label(key)
                ax.plot(*zip(*pts), color=cmap(j / max(len(series) - 1, 1)), linestyle=styles[i % len(styles)],
                        marker=".", label=f"{run.label}: {name}" if len(runs) > 1 else name)
        ax.set_title(title if len(runs) > 1 else f"{title}\n{runs[0].label}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_xlim(0, horizon * 1.02 or 1)  # the whole training, not a 20-step window around one record
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        if log and all(min(line.get_ydata()) > 0 for line in ax.get_lines()):
            plotting.log_y(ax)
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
    with atomic_path(out) as tmp:  # created by savefig, with the user's umask; legends outside the axes kept
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return out
