"""Probe figures in the style of the paper, drawn only from a probe report (``geometry.json``).

Figure labels follow the LaTeX source (its figures are numbered 1-8 in order: 3 is
``fig:baseloop_coreloop_geometry``, 8 ``fig:conditioning_responses``; the appendix figure is
``fig:appendix_composition_geometry``). Notation as in the evaluation figures: r inference loops,
K training loops, L(r) = p + r·s + c effective depth (App. C.4 writes L for r and D for L(r)).

* :func:`trajectory_figure` (Fig. 3 and the appendix geometry figures): (a) block angle A_l over
  effective depth l, crosses on coda occurrences; (b) loop angle A_loop(t) at (t + 1) / K;
  (c) loop update rho_loop(t) at (t + 1) / K, log y; (d) normalised variance V~(t) at t / K
  (t = 0 included), log y. A dashed line at t = K in (b)-(d); bands of mean ± standard error
  over the N sequences ((d): over the |T| positions); shorter runs drawn above longer ones.
* :func:`interaction_figure` (Fig. 8 b,c and appendix a): C(d) and N(d) against loop lag d.
* :func:`terminal_response_figure` (Fig. 8 a): the response to skipping the occurrences just past
  the training depth, relative to the final loop's mean, over the later targets; crosses on coda
  blocks, the terminal-to-core ratio in the legend.
* :func:`comparison_figure` (needs ``--reference-json``): (a) R(d) = C_A(d) / C_B(d) (Fig. 8 d);
  (b) ratios of the pair-weighted means of C, N and B over each lag set (appendix c); (c) the
  ratio of mean C per shared-block pair s:q over each lag set, separators between source blocks
  (appendix b, d). (b) and (c) have categories on x: points, no joining lines. The title names
  A (this report) and B (the reference).

Depths alternate between dashed lines with open circles and solid lines with filled triangles, as
in the paper; the reference at one is a legend entry. Every figure names the model (the report's
``label`` and layout) and the probe sample (N sequences, |T| positions) in its title and has one
legend, outside the axes. Each ``*_figure`` returns the Figure (or
None when the report holds no data for it); :func:`write_figures` saves every one available.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from megatron_loop import plotting
from megatron_loop.atomic import atomic_path

TRAJECTORY_PNG = "geometry_trajectory.png"
INTERACTION_PNG = "geometry_interaction.png"
TERMINAL_PNG = "geometry_terminal_response.png"
COMPARISON_PNG = "geometry_comparison.png"
DODGE = 0.08  # sideways offset between series on a categorical axis (fraction of one category)
QUANTITIES = (("C", "C: relative\nresponse"), ("N", "N: raw\nresponse"), ("B", "B: baseline\nupdate"))


def _sorted_results(report: dict) -> list[dict]:
    return [report["loops"][k] for k in sorted(report["loops"], key=int)]


def _style(index: int) -> dict:
    if index % 2:
        return dict(linestyle="-", marker="^", color=f"C{index % 10}")
    return dict(linestyle="--", marker="o", markerfacecolor="none", color=f"C{index % 10}")


def depth_label(result: dict) -> str:
    return f"r={result['num_loops']}, L(r)={result['effective_depth']}"


def model_name(report: dict) -> str:
    """The probed model as every figure names a run, ``NAME (p+sxK+c, conditioning)``: its ``label``
    (the run's name), layout and conditioning (left out when none, or not recorded by older reports);
    the layout alone in reports written without a label."""
    layout = report["layout"]
    name = f"{layout['prelude']}+{layout['shared']}x{report['train_loops']}+{layout['coda']}"
    facts = ", ".join([name] + ([report["conditioning"]] if report.get("conditioning", "none") != "none" else []))
    return f"{report['label']} ({facts})" if report.get("label") else name


def sample_text(report: dict) -> str:
    sampling = report["sampling"]
    return (f"N = {sampling['num_sequences']} sequences of {sampling['seq_length']} tokens, "
            f"|T| = {sampling['num_positions']} positions")


def _with_band(ax, xs, ys, errs, style: dict) -> None:
    """A line and, when the report has standard errors, a band of mean ± standard error under it."""
    line, = ax.plot(xs, ys, **style)
    if errs and all(e is not None for e in errs):
        ax.fill_between(xs, [y - e for y, e in zip(ys, errs)], [y + e for y, e in zip(ys, errs)],
                        color=line.get_color(), alpha=0.18, lw=0, zorder=line.get_zorder() - 0.5)


def trajectory_figure(report: dict):
    """The four-panel trajectory figure (Fig. 3 layout). Every probed r shares its first
    occurrences with the longer ones, so shorter runs are drawn above longer ones (z-order): r = 1
    stays visible where the curves coincide. Bands: mean ± standard error over the N probe
    sequences ((d): over the |T| positions)."""
    train = report["train_loops"]
    results = _sorted_results(report)
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.3))
    banded = False
    for index, result in enumerate(results):
        loops, label = result["num_loops"], depth_label(result)
        style = dict(_style(index), markersize=4, linewidth=1.2, zorder=3 + len(results) - index, label=label)
        block, loop = result["block"], result["loop"]
        banded |= block.get("angle_stderr") is not None
        _with_band(axes[0], list(range(1, result["effective_depth"] + 1)), block["angle"], block.get("angle_stderr"),
                   style)
        coda = [(p, a) for p, (seg, a) in enumerate(zip(result["segments"], block["angle"]), start=1) if seg == "coda"]
        if coda:
            axes[0].scatter(*zip(*coda), marker="x", s=40, color=style["color"], zorder=style["zorder"] + 0.1)
        after = [(t + 1) / train for t in range(loops)]
        _with_band(axes[1], after, loop["angle"], loop.get("angle_stderr"), style)
        _with_band(axes[2], after, loop["relative_update"], loop.get("relative_update_stderr"), style)
        if loop.get("normalized_state_variance"):
            _with_band(axes[3], [t / train for t in range(loops + 1)], loop["normalized_state_variance"],
                       loop.get("normalized_state_variance_stderr"), style)
    if any("coda" in r["segments"] for r in report["loops"].values()):
        axes[0].scatter([], [], marker="x", color="0.3", label="coda block")
    axes[0].set(title="(a) block angular distance", xlabel="effective depth $\\ell$", ylabel="$A_\\ell$")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set(title="(b) loop angular distance", xlabel="loop t / K", ylabel="$A_{loop}(t)$")
    axes[2].set(title="(c) loop relative update norm", xlabel="loop t / K", ylabel="$\\rho_{loop}(t)$", yscale="log")
    axes[3].set(title="(d) normalized state variance", xlabel="loop t / K",
                ylabel="$V(x^{(t)}) / V(x^{(K)})$", yscale="log")
    axes[3].axhline(1.0, color="gray", linewidth=0.8, linestyle=":", label="$V(x^{(t)}) = V(x^{(K)})$")
    for ax in axes[1:]:
        ax.axvline(1.0, color="gray", linewidth=0.8, linestyle="--", label=f"training loops t = K = {train}")
    for ax in axes:
        ax.grid(alpha=0.3)
    added = report.get("reference_loops_added") or []
    fig.suptitle(f"{model_name(report)}: geometry probes (App. C.4) on {sample_text(report)}"
                 + (f"; r = {', '.join(map(str, added))} probed only to normalise (d)" if added else ""), fontsize=10)
    band = {"band: mean ± standard error over the N sequences ((d): over the |T| positions)":
            Patch(color="0.5", alpha=0.3)} if banded else None
    plotting.legend_outside(axes[3], fig, every_axis=True, extra=band)
    return fig


def interaction_figure(report: dict):
    """C(d) and N(d) by loop lag (pairs beyond the training loops); None without such pairs."""
    results = [r for r in _sorted_results(report) if r.get("interaction") and r["interaction"]["by_lag"]]
    if not results:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, result in enumerate(results):
        by_lag = result["interaction"]["by_lag"]
        axes[0].plot(by_lag["lags"], by_lag["C"], **_style(index), label=depth_label(result))
        axes[1].plot(by_lag["lags"], by_lag["N"], **_style(index), label=depth_label(result))
    axes[0].set(title="relative response $C(d)$", xlabel="loop lag $d$", ylabel="mean $C$ (ratio of norms)")
    axes[1].set(title="raw response $N(d)$", xlabel="loop lag $d$", ylabel="mean $N$ (hidden-state norm)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{model_name(report)}: computational interaction by loop lag, {sample_text(report)}", fontsize=10)
    plotting.legend_outside(axes[1], fig)
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
    ax.set(title=f"{model_name(report)}: response to skipping the occurrences past L(K),\nrelative to the final loop",
           xlabel="target effective depth $j$", ylabel="mean $C_{i\\to j}$ / final-loop mean")
    ax.title.set_fontsize(10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    plotting.legend_outside(ax, fig)
    return fig


def comparison_figure(report: dict):
    """Configuration A (this report) over reference B; None without ``comparison``. Panels (b) and
    (c) have categories on x (quantities, block pairs): markers only, nudged sideways per series,
    no line joining categories."""
    comparison = report.get("comparison") or {}
    entries = [(report["loops"][L], comparison[L]) for L in sorted(comparison, key=int)]
    if not entries:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(19, 4.4), gridspec_kw={"width_ratios": [1, 0.9, 1.6]})
    pair_names = list(dict.fromkeys(n for _, e in entries for p in e.get("block_pair_ratio", {}).values()
                                    for n in p["pairs"]))
    series = [(index, name) for index, (_, entry) in enumerate(entries) for name in sorted(entry.get("ratio", {}))]
    dodge = {key: (k - (len(series) - 1) / 2) * DODGE for k, key in enumerate(series)}
    for index, (result, entry) in enumerate(entries):
        label = depth_label(result)
        ratio = entry["ratio_by_lag"]["C"]
        axes[0].plot(ratio["lags"], ratio["ratio"], **_style(index), label=label)
        for k, (name, values) in enumerate(sorted(entry.get("ratio", {}).items())):
            axes[1].plot([q + dodge[index, name] for q in range(len(QUANTITIES))], [values[q] for q, _ in QUANTITIES],
                         **{**_style(index), "linestyle": "none"}, alpha=1.0 if k == 0 else 0.6,
                         label=f"{label}, lags {name}")
        for k, (name, pairs) in enumerate(sorted(entry.get("block_pair_ratio", {}).items())):
            axes[2].plot([pair_names.index(p) + dodge.get((index, name), 0.0) for p in pairs["pairs"]], pairs["C"],
                         **{**_style(index), "linestyle": "none"}, alpha=1.0 if k == 0 else 0.6,
                         label=f"{label}, lags {name}")
    sources = [n.split(":")[0] for n in pair_names]
    boundaries = [i - 0.5 for i in range(1, len(sources)) if sources[i] != sources[i - 1]]
    for k, position in enumerate(boundaries):
        axes[2].axvline(position, color="0.75", linewidth=0.8,
                        label="boundary between source blocks s" if k == 0 else None)
    axes[0].set(title="(a) $R(d) = C_A(d) / C_B(d)$", xlabel="loop lag $d$", ylabel="ratio of mean $C$")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set(title="(b) ratio of pair-weighted means", xlabel="quantity", ylabel="A / B",
                xticks=range(len(QUANTITIES)), xticklabels=[text for _, text in QUANTITIES], xlim=(-0.5, 2.5))
    axes[2].set(title="(c) ratio of mean $C$ per shared-block pair $s{:}q$", xlabel="source:target block",
                ylabel="A / B", xticks=range(len(pair_names)), xticklabels=pair_names,
                xlim=(-0.5, len(pair_names) - 0.5))
    for ax in axes:
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":", label="equal (A / B = 1)")
        ax.grid(alpha=0.3)
    reference = report.get("comparison_reference") or "the reference report"
    fig.suptitle(f"A = {model_name(report)} over B = {reference} (--reference-json), {sample_text(report)}",
                 fontsize=10)
    plotting.legend_outside(axes[2], fig, every_axis=True)
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
