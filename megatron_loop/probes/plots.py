"""Figures in the style of the paper: Fig. 3 / Fig. 7 trajectory panels and the interaction
panels of Fig. 5 (b,c) (App. A.4 "State variance and plot normalization").

Trajectory figure, one curve per inference loop count L:
(a) block angle A_l over effective depth l, crosses on coda occurrences;
(b) loop angle A_loop(t) at (t + 1) / L_tr;  (c) loop update rho_loop(t) at (t + 1) / L_tr, log y;
(d) normalised variance V~(t) at t / L_tr (t = 0 included), log y.
A dashed reference at one marks the training loop count in (b)-(d).
Interaction figure: C(d) and N(d) against loop lag d, alternating dashed open circles and solid
filled triangles between depths as in the paper.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _sorted_results(report: dict) -> list[dict]:
    return [report["loops"][k] for k in sorted(report["loops"], key=int)]


def _style(index: int) -> dict:
    if index % 2:
        return dict(linestyle="-", marker="^")
    return dict(linestyle="--", marker="o", markerfacecolor="none")


def plot_trajectory(report: dict, path: str | Path) -> Path:
    """Writes the four-panel trajectory figure (Fig. 3 / Fig. 7 layout) to ``path``."""
    train = report["train_loops"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for index, result in enumerate(_sorted_results(report)):
        L, label = result["num_loops"], f"L={result['num_loops']} (D={result['effective_depth']})"
        line, = axes[0].plot(range(1, result["effective_depth"] + 1), result["block"]["angle"],
                             linewidth=1, label=label)
        coda = [(p, a) for p, (seg, a) in enumerate(zip(result["segments"], result["block"]["angle"]), start=1)
                if seg == "coda"]
        if coda:
            axes[0].scatter(*zip(*coda), marker="x", s=40, color=line.get_color(), zorder=3)
        after = [(t + 1) / train for t in range(L)]
        style = dict(_style(index), color=line.get_color(), markersize=4, label=label)
        axes[1].plot(after, result["loop"]["angle"], **style)
        axes[2].plot(after, result["loop"]["relative_update"], **style)
        if result["loop"].get("normalized_state_variance"):
            axes[3].plot([t / train for t in range(L + 1)], result["loop"]["normalized_state_variance"], **style)
    axes[0].set(title="(a) block angular distance", xlabel="effective depth $\\ell$", ylabel="$A_\\ell$")
    axes[1].set(title="(b) loop angular distance", xlabel="loop / training loops", ylabel="$A_{loop}(t)$")
    axes[2].set(title="(c) loop relative update norm", xlabel="loop / training loops",
                ylabel="$\\rho_{loop}(t)$", yscale="log")
    axes[3].set(title="(d) normalized state variance", xlabel="loop / training loops",
                ylabel="$V(x^{(t)}) / V(x^{(L_{tr})})$", yscale="log")
    axes[3].axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    for ax in axes[1:]:
        ax.axvline(1.0, color="gray", linewidth=0.8, linestyle="--")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_interaction(report: dict, path: str | Path) -> Path | None:
    """Writes C(d) and N(d) by loop lag (pairs beyond the training loops); None when no depth
    extends past the training loops or the interaction was not measured."""
    results = [r for r in _sorted_results(report) if r.get("interaction") and r["interaction"]["by_lag"]]
    if not results:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for index, result in enumerate(results):
        by_lag = result["interaction"]["by_lag"]
        label = f"D={result['effective_depth']} (L={result['num_loops']})"
        axes[0].plot(by_lag["lags"], by_lag["C"], **_style(index), label=label)
        axes[1].plot(by_lag["lags"], by_lag["N"], **_style(index), label=label)
    axes[0].set(title="relative response $C(d)$", xlabel="loop lag $d$", ylabel="mean $C$")
    axes[1].set(title="raw response $N(d)$", xlabel="loop lag $d$", ylabel="mean $N$")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
