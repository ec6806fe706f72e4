"""Helpers shared by every figure of the project (evaluation, probes, training curves): matplotlib
with the Agg backend (PNG files, no display), the legend outside the axes, log axes with
plain-number ticks, and the name a run goes by on a figure."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
from matplotlib.ticker import NullLocator  # noqa: E402

from megatron_loop.config.naming import run_folder_name  # noqa: E402


def legend_outside(ax, fig, every_axis: bool = False, extra: dict | None = None) -> None:
    """One legend to the right of ``ax`` (so it never covers a line); with ``every_axis`` it holds
    the entries of all the figure's panels, each label once; ``extra`` adds {label: handle}
    entries that are drawn nowhere (a key to a shading style). Then ``tight_layout``."""
    handles: dict = {}
    for each in (fig.axes if every_axis else [ax]):
        for handle, label in zip(*each.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    handles.update(extra or {})
    ax.legend(list(handles.values()), list(handles.keys()), fontsize=7, loc="upper left",
              bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()


def log_y(ax, count: int = 7) -> None:
    """Log y with plain-number ticks: 1-1.2-1.5-2-3-4-5-7 times powers of ten inside the drawn range
    (at most ``count`` of them), or, for a range too narrow to hold three of those (a loss of
    1.04-1.14), ``count`` ticks spread evenly in log space with enough digits to tell them apart.
    The default log ticks would label nothing inside one decade, or write 1.1 × 10^0."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    nice = [m * 10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
            for m in (1, 1.2, 1.5, 2, 3, 4, 5, 7)]
    ticks = [t for t in nice if low <= t <= high]
    ticks = ticks[::math.ceil(len(ticks) / count)] if ticks else []
    if len(ticks) < 3:
        ratio, digits = (high / low) ** (1 / (count - 1)), 2
        while len(ticks) < count - 1 and digits < 6:
            ticks = sorted({float(f"{low * ratio ** i:.{digits}g}") for i in range(count)})
            digits += 1
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(low, high)


# NAME of runs/NAME/train[/checkpoints[/global_stepN]] or runs/NAME/hf (training reads it without matplotlib)
run_name = run_folder_name
