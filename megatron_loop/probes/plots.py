"""Probe figures in the style of the paper, drawn only from a probe report (``geometry.json``).

Figure labels follow the LaTeX source (its figures are numbered 1-8 in order: 3 is
``fig:baseloop_coreloop_geometry``, 8 ``fig:conditioning_responses``; the appendix figure is
``fig:appendix_composition_geometry``). Notation as in the evaluation figures: r inference loops,
K training loops, L(r) = p + r·s + c effective depth (App. C.4 writes L for r and D for L(r)).

* :func:`trajectory_figure` (Fig. 3 and the appendix geometry figures): (a) block angle A_l over
  effective depth l, crosses on coda occurrences; (b) loop angle A_loop(t) at (t + 1) / K;
  (c) loop update rho_loop(t) at (t + 1) / K, log y; (d) normalised variance V~(t) at t / K
  (t = 0 included), log y. A dashed line at t = K in (b)-(d).
* :func:`interaction_figure` (Fig. 8 b,c and appendix a): C(d) and N(d) against loop lag d.
* :func:`terminal_response_figure` (Fig. 8 a): the response to skipping the occurrences just past
  the training depth, relative to the final loop's mean, over the later targets; crosses on coda
  blocks, the terminal-to-core ratio in the legend.
* :func:`comparison_figure` (needs ``--reference-json``): (a) R(d) = C_A(d) / C_B(d) (Fig. 8 d);
  (b) ratios of the pair-weighted means of C, N and B over each lag set (appendix c); (c) the
  ratio of mean C per shared-block pair s:q over each lag set, separators between source blocks
  (appendix b, d).

Depths alternate between dashed lines with open circles and solid lines with filled triangles, as
in the paper; the reference at one is a legend entry. Each ``*_figure`` returns the Figure (or
None when the report holds no data for it); :func:`write_figures` saves every one available.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from megatron_loop.atomic import atomic_path  # noqa: E402

TRAJECTORY_PNG = "geometry_trajectory.png"
INTERACTION_PNG = "geometry_interaction.png"
TERMINAL_PNG = "geometry_terminal_response.png"
COMPARISON_PNG = "geometry_comparison.png"


def _sorted_results(report: dict) -> list[dict]:
    return [report["loops"][k] for k in sorted(report["loops"], key=int)]


def _style(index: int) -> dict:
    if index % 2:
        return dict(linestyle="-", marker="^")
    return dict(linestyle="--", marker="o", markerfacecolor="none")


def depth_label(result: dict) -> str:
    return f"r={result['num_loops']}, L(r)={result['effective_depth']}"


def _legend_right(ax, fig) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()


def trajectory_figure(report: dict):
    """The four-panel trajectory figure (Fig. 3 layout)."""
    train = report["train_loops"]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    for index, result in enumerate(_sorted_results(report)):
        loops, label = result["num_loops"], depth_label(result)
        # depths share their first occurrences (same computation): alternate dashes so none hides another
        line, = axes[0].plot(range(1, result["effective_depth"] + 1), result["block"]["angle"], linewidth=1.2,
                             linestyle=_style(index)["linestyle"], label=label)
        coda = [(p, a) for p, (seg, a) in enumerate(zip(result["segments"], result["block"]["angle"]), start=1)
                if seg == "coda"]
        if coda:
            axes[0].scatter(*zip(*coda), marker="x", s=40, color=line.get_color(), zorder=3)
        after = [(t + 1) / train for t in range(loops)]
        style = dict(_style(index), color=line.get_color(), markersize=4, label=label)
        axes[1].plot(after, result["loop"]["angle"], **style)
        axes[2].plot(after, result["loop"]["relative_update"], **style)
        if result["loop"].get("normalized_state_variance"):
            axes[3].plot([t / train for t in range(loops + 1)], result["loop"]["normalized_state_variance"], **style)
    if any("coda" in r["segments"] for r in report["loops"].values()):
        axes[0].scatter([], [], marker="x", color="0.3", label="coda block")
    axes[0].set(title="(a) block angular distance", xlabel="effective depth $\\ell$", ylabel="$A_\\ell$")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set(title="(b) loop angular distance", xlabel="loop t / K", ylabel="$A_{loop}(t)$")
    axes[2].set(title="(c) loop relative update norm", xlabel="loop t / K", ylabel="$\\rho_{loop}(t)$", yscale="log")
    axes[3].set(title="(d) normalized state variance", xlabel="loop t / K",
                ylabel="$V(x^{(t)}) / V(x^{(K)})$", yscale="log")
    axes[3].axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    for ax in axes[1:]:
        ax.axvline(1.0, color="gray", linewidth=0.8, linestyle="--", label=f"training loops t = K = {train}")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _legend_right(axes[3], fig)
    return fig


def interaction_figure(report: dict):
    """C(d) and N(d) by loop lag (pairs beyond the training loops); None without such pairs."""
    results = [r for r in _sorted_results(report) if r.get("interaction") and r["interaction"]["by_lag"]]
    if not results:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, result in enumerate(results):
        by_lag = result["interaction"]["by_lag"]
        axes[0].plot(by_lag["lags"], by_lag["C"], **_style(index), label=depth_label(result))
        axes[1].plot(by_lag["lags"], by_lag["N"], **_style(index), label=depth_label(result))
    axes[0].set(title="relative response $C(d)$", xlabel="loop lag $d$", ylabel="mean $C$ (ratio of norms)")
    axes[1].set(title="raw response $N(d)$", xlabel="loop lag $d$", ylabel="mean $N$ (hidden-state norm)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _legend_right(axes[1], fig)
    return fig


def terminal_response_figure(report: dict):
    """Fig. 8 (a) for every probed r whose report has a terminal response; None otherwise."""
    results = [r for r in _sorted_results(report)
               if r.get("interaction") and r["interaction"].get("terminal_response")]
    if not results:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for index, result in enumerate(results):
        tr = result["interaction"]["terminal_response"]
        first, last = tr["sources"][0], tr["sources"][-1]
        line, = ax.plot(tr["targets"], tr["relative"], **_style(index), markersize=4,
                        label=f"{depth_label(result)}: skips at {first}-{last}, "
                              f"terminal/core = {tr['terminal_to_core']:.2f}")
        coda = [(j, v) for j, v, seg in zip(tr["targets"], tr["relative"], tr["segments"]) if seg == "coda"]
        if coda:
            ax.scatter(*zip(*coda), marker="x", s=60, color=line.get_color(), zorder=3)
    if any(seg == "coda" for r in results for seg in r["interaction"]["terminal_response"]["segments"]):
        ax.scatter([], [], marker="x", color="0.3", label="coda block")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":", label="final-loop mean = 1")
    ax.set(title="response to skipping the occurrences past L(K), relative to the final loop",
           xlabel="target effective depth $j$", ylabel="mean $C_{i\\to j}$ / final-loop mean")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    _legend_right(ax, fig)
    return fig


def comparison_figure(report: dict):
    """Configuration A (this report) over reference B; None without ``comparison``."""
    comparison = report.get("comparison") or {}
    entries = [(report["loops"][L], comparison[L]) for L in sorted(comparison, key=int)]
    if not entries:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(19, 4.2), gridspec_kw={"width_ratios": [1, 0.8, 1.6]})
    for index, (result, entry) in enumerate(entries):
        label = depth_label(result)
        ratio = entry["ratio_by_lag"]["C"]
        axes[0].plot(ratio["lags"], ratio["ratio"], **_style(index), label=label)
        for k, (name, values) in enumerate(sorted(entry.get("ratio", {}).items())):
            axes[1].plot(["C", "N", "B"], [values[key] for key in ("C", "N", "B")], **_style(index),
                         alpha=1.0 if k == 0 else 0.6, label=f"{label}, lags {name}")
        for k, (name, pairs) in enumerate(sorted(entry.get("block_pair_ratio", {}).items())):
            axes[2].plot(pairs["pairs"], pairs["C"], **_style(index), alpha=1.0 if k == 0 else 0.6,
                         label=f"{label}, lags {name}")
    pair_names = [n for _, e in entries for p in e.get("block_pair_ratio", {}).values() for n in p["pairs"]]
    sources = [n.split(":")[0] for n in dict.fromkeys(pair_names)]
    for position in [i - 0.5 for i in range(1, len(sources)) if sources[i] != sources[i - 1]]:
        axes[2].axvline(position, color="0.75", linewidth=0.8)
    axes[0].set(title="(a) $R(d) = C_A(d) / C_B(d)$", xlabel="loop lag $d$", ylabel="ratio of mean $C$")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set(title="(b) ratio of pair-weighted means", xlabel="quantity", ylabel="A / B")
    axes[2].set(title="(c) ratio of mean $C$ per shared-block pair $s{:}q$", xlabel="source:target block",
                ylabel="A / B")
    for ax in axes:
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":", label="equal (ratio 1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


FIGURES = ((TRAJECTORY_PNG, trajectory_figure), (INTERACTION_PNG, interaction_figure),
           (TERMINAL_PNG, terminal_response_figure), (COMPARISON_PNG, comparison_figure))


def write_figures(report: dict, output_dir: str | Path) -> list[Path]:
    """Saves every figure the report has data for into ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in FIGURES:
        fig = make(report)
        if fig is not None:
            with atomic_path(out / name) as tmp:
                fig.savefig(tmp, dpi=120, bbox_inches="tight")
            plt.close(fig)
            paths.append(out / name)
    return paths
