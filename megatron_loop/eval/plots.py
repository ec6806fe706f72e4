"""Loop-sweep figures (matplotlib, Agg backend, PNG).

* :func:`plot_groups` -- Overall / Knowledge / Reasoning against effective depth L(r), one
  line per model, dashed vertical line at the training depth L(K) and the extrapolation
  region L(r) > L(K) shaded (paper Fig. 2 style).
* :func:`plot_per_depth` -- accuracy per proof depth / chain length against L(r), one line
  per depth (Fig. 1 b,c style).
* :func:`plot_loss` -- held-out loss against r.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PANELS = (("overall", "Overall"), ("knowledge", "Knowledge"), ("reasoning", "Reasoning"))


def _label(results: dict) -> str:
    return results.get("label") or results.get("layout") or Path(results["model"]).name


def _training_marks(ax, results_list: list[dict]) -> None:
    train_depths = sorted({r["training_depth"] for r in results_list})
    for depth in train_depths:
        ax.axvline(depth, color="0.3", linestyle="--", linewidth=1)
    left = min(min(r["effective_depth"].values()) for r in results_list)
    right = max(max(r["effective_depth"].values()) for r in results_list)
    if right > train_depths[0]:  # loop extrapolation: L(r) beyond the training depth L(K)
        ax.axvspan(train_depths[0], right, color="gold", alpha=0.15, lw=0)
    ax.set_xlim(left - 0.5, right + 0.5)


def plot_groups(results_list: list[dict], path: str | Path) -> Path:
    """Fig. 2 style: three panels (Overall, Knowledge, Reasoning) vs effective depth."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, title) in zip(axes, PANELS):
        drawn = False
        for res in results_list:
            pts = [(res["effective_depth"][r], v) for r, v in res["groups"][key].items() if v is not None]
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, marker="o", label=_label(res))
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no tasks of this group evaluated", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        _training_marks(ax, results_list)
        ax.set_title(title)
        ax.set_xlabel("effective depth L(r)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (%)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_per_depth(results: dict, task: str, path: str | Path) -> Path:
    """Fig. 1 b,c style: one line per depth stratum, accuracy vs effective depth."""
    by_r = results["per_depth"][task]
    strata = sorted({d for cells in by_r.values() for d in cells})
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for depth in strata:
        pts = sorted((results["effective_depth"][r], cells[depth]["accuracy"])
                     for r, cells in by_r.items() if depth in cells)
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=f"depth {depth}")
    _training_marks(ax, [results])
    ax.set_title(f"{task} by depth ({_label(results)})")
    ax.set_xlabel("effective depth L(r)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def plot_loss(results_list: list[dict], path: str | Path) -> Path:
    """Held-out loss vs loop count r, one line per model; dashed line at each model's K."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for res in results_list:
        pts = sorted((r, v["loss"]) for r, v in res["heldout"].items())
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=_label(res))
        ax.axvline(res["train_loops"], color="0.3", linestyle="--", linewidth=1)
    ax.set_xlabel("loop count r")
    ax.set_ylabel("held-out loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


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


def _save(fig, path: str | Path) -> Path:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # depths and loop counts are integers
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
