"""Loop-sweep figures (matplotlib, Agg backend, PNG).

* :func:`plot_groups` -- Overall / Knowledge / Reasoning against effective depth L(r), one
  line per model, dashed vertical line at the training depth L(K) and the extrapolation
  region L(r) > L(K) shaded (paper Fig. 2 style).
* :func:`plot_per_depth` -- accuracy per proof depth / chain length against L(r), one line
  per depth (Fig. 1 b,c style); depths the task declares as trained are marked in the legend.
* :func:`plot_loss` -- held-out loss against r.

Notation shared with the probe figures: r is the inference loop count, K the training loop
count, L(r) = p + r·s + c the effective depth. Every score point carries its standard error
(lm-eval's) as an error bar, every score panel the chance level of its items; the training
depth, the extrapolation shading and the chance line are legend entries. Series are told apart
by marker and line style and nudged sideways a little, so equal values do not hide each other.
Each ``*_figure`` function returns the Figure (tests read the plotted numbers back from it);
``plot_*`` save it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PANELS = (("overall", "Overall"), ("knowledge", "Knowledge"), ("reasoning", "Reasoning"))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")
DODGE = 0.12  # sideways offset between series, in effective-depth units (points stay on their integer L(r))


def _label(results: dict) -> str:
    return results.get("label") or results.get("layout") or Path(results["model"]).name


def _series_style(index: int) -> dict:
    return dict(marker=MARKERS[index % len(MARKERS)], linestyle=LINESTYLES[index % len(LINESTYLES)],
                markersize=5, capsize=2, linewidth=1.4, elinewidth=0.9)


def _offset(index: int, count: int) -> float:
    return (index - (count - 1) / 2) * DODGE if count > 1 else 0.0


def _nan(value) -> float:
    return math.nan if value is None else value


def _series(ax, index: int, count: int, xs, ys, errs, label: str, **style):
    """One line with error bars (NaN bars are not drawn), nudged by its series index."""
    dx = _offset(index, count)
    return ax.errorbar([x + dx for x in xs], ys, yerr=[_nan(e) for e in errs], label=label,
                       **{**_series_style(index), **style})


def _training_marks(ax, results_list: list[dict], key: str = "training_depth", name: str = "L(K)",
                    what: str = "effective depth") -> None:
    """Dashed line at each training depth and the extrapolation region beyond it, both in the legend."""
    train_depths = sorted({r[key] for r in results_list})
    xs = [x for r in results_list for x in (r["effective_depth"].values() if key == "training_depth" else r["loops"])]
    for depth in train_depths:
        ax.axvline(depth, color="0.3", linestyle="--", linewidth=1, label=f"training {what} {name} = {depth}")
    left, right = min(xs), max(xs)
    if right > train_depths[0]:  # loop extrapolation: r > K
        ax.axvspan(train_depths[0], right + 0.5, color="gold", alpha=0.15, lw=0, label="extrapolation (r > K)")
    ax.set_xlim(left - 0.5, right + 0.5)


def _chance_lines(ax, values: list[float]) -> None:
    """A dotted line at each distinct chance level (mean over items of 1 / number of choices), its
    value written on the line; one legend entry for all of them."""
    for i, value in enumerate(sorted({round(v, 6) for v in values})):
        ax.axhline(value, color="0.45", linestyle=":", linewidth=1.2, label="chance level" if i == 0 else None)
        ax.annotate(f"{value:.1f}%", (0.005, value), xycoords=("axes fraction", "data"), fontsize=6,
                    color="0.35", va="bottom")


def groups_figure(results_list: list[dict]):
    """Fig. 2 style: three panels (Overall, Knowledge, Reasoning) vs effective depth."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    for ax, (key, title) in zip(axes, PANELS):
        drawn = [res for res in results_list if any(v is not None for v in res["groups"][key].values())]
        for index, res in enumerate(drawn):
            rs = sorted(r for r, v in res["groups"][key].items() if v is not None)
            errs = res.get("groups_stderr", {}).get(key, {})
            _series(ax, index, len(drawn), [res["effective_depth"][r] for r in rs], [res["groups"][key][r] for r in rs],
                    [errs.get(r) for r in rs], _label(res))
        if not drawn:
            ax.text(0.5, 0.5, "no tasks of this group evaluated", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        _chance_lines(ax, [res["groups_chance"][key] for res in drawn
                           if res.get("groups_chance", {}).get(key) is not None])
        _training_marks(ax, results_list)
        ax.set_title(title)
        ax.set_xlabel("effective depth L(r)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (%)")
    _legend_right(axes[-1], fig)
    return fig


def per_depth_figure(results: dict, task: str):
    """Fig. 1 b,c style: one line per depth stratum, accuracy vs effective depth."""
    by_r = results["per_depth"][task]
    axis = results.get("depth_axes", {}).get(task, "depth")
    trained = set(results.get("trained_depths", {}).get(task, []))
    strata = sorted({d for cells in by_r.values() for d in cells})
    fig, ax = plt.subplots(figsize=(7.5, 4))
    chance = []
    for index, depth in enumerate(strata):
        rs = sorted(r for r, cells in by_r.items() if depth in cells)
        cells = [by_r[r][depth] for r in rs]
        suffix = "" if not trained else (" (trained)" if depth in trained else " (not in training)")
        _series(ax, index, len(strata), [results["effective_depth"][r] for r in rs], [c["accuracy"] for c in cells],
                [c.get("stderr") for c in cells], f"{axis} {depth}{suffix}",
                **({} if not trained else {"linestyle": "-" if depth in trained else "--"}))
        chance += [c["chance"] for c in cells if c.get("chance") is not None]
    _chance_lines(ax, chance)
    _training_marks(ax, [results])
    ax.set_title(f"{task} by {axis} ({_label(results)})")
    ax.set_xlabel("effective depth L(r)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    _legend_right(ax, fig)
    return fig


def loss_figure(results_list: list[dict]):
    """Held-out loss vs loop count r, one line per model; dashed line at each model's K."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    drawn = [res for res in results_list if res.get("heldout")]
    for index, res in enumerate(drawn):
        rs = sorted(res["heldout"])
        _series(ax, index, len(drawn), rs, [res["heldout"][r]["loss"] for r in rs],
                [res["heldout"][r].get("stderr") for r in rs], _label(res))
    _training_marks(ax, drawn, key="train_loops", name="K", what="loops")
    ax.set_xlabel("loop count r")
    ax.set_ylabel("held-out loss (nats / token)")
    ax.grid(alpha=0.3)
    _legend_right(ax, fig)
    return fig


def plot_groups(results_list: list[dict], path: str | Path) -> Path:
    return _save(groups_figure(results_list), path)


def plot_per_depth(results: dict, task: str, path: str | Path) -> Path:
    return _save(per_depth_figure(results, task), path)


def plot_loss(results_list: list[dict], path: str | Path) -> Path:
    return _save(loss_figure(results_list), path)


def write_all_plots(results: dict, output: str | Path, others: list[dict] | None = None) -> list[Path]:
    """Every figure a sweep supports, into ``output``; ``others`` adds models to the shared figures."""
    out = Path(output)
    everyone = [results, *(others or [])]
    paths = []
    if any(v is not None for v in results["groups"]["overall"].values()):
        paths.append(plot_groups(everyone, out / "groups_vs_depth.png"))
    for task in results.get("per_depth", {}):
        paths.append(plot_per_depth(results, task, out / f"per_depth_{task}.png"))
    if results.get("heldout"):
        paths.append(plot_loss([r for r in everyone if r.get("heldout")], out / "loss_vs_loops.png"))
    return paths


def _legend_right(ax, fig) -> None:
    """Legend outside the axes (so it never covers a line); integer ticks on the x axes, which are
    effective depths or loop counts."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    for each in fig.axes:
        each.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
