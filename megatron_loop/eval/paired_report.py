"""The report of the paired loop study (``finding1_paired``): ``summary.json``, ``summary.md`` (the
tables docs/REPRODUCE.md quotes) and the figures, from the summary that ``eval/paired_stats.py``'s
:func:`~megatron_loop.eval.paired_stats.analyse` computes: the paired changes over r with their
hierarchical-bootstrap intervals (Fig. 1(a) style), accuracy and Delta_R per hop (Fig. 1(b,c)
style), and the primary statistic with its control per allocation.
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_loop.atomic import atomic_path, write_atomic

def _ci(stat: dict | None) -> str:
    if stat is None:
        return "—"
    return f"{stat['mean']:+.1f} [{stat['lo95']:+.1f}, {stat['hi95']:+.1f}]"


def markdown(summary: dict) -> str:
    """The tables of REPRODUCE.md: primary statistic per allocation, per seed, per hop, curves."""
    plan = summary["plan"]
    lines = []
    if plan.get("post_hoc"):
        lines += ["**Post hoc, not the registered test:** every run, the exclusion rule switched off (chosen after "
                  "the data were seen; the registered analysis is the study's own summary.md).", ""]
    lines += [f"Primary model `{summary['primary_model']}`: **{summary['verdict']}** (decision rule: one-sided 95 % "
             "bounds Delta_R > 0 and Delta_K < 0, at least "
             f"{plan['min_seeds']} included seeds).", "",
             *([f"Not run (the study was cut short): {', '.join(f'`{n}`' for n in summary['not_run'])}.", ""]
               if summary.get("not_run") else []),
             "Paired changes at r = 2K against r = K (percentage points; mean over included seeds, 95 % hierarchical "
             "bootstrap interval; one-sided 95 % bound in brackets after it):", "",
             "| model | seeds | Delta_R (reasoning) | Delta_K (knowledge) | D = Delta_R - Delta_K | verdict |",
             "|---|---|---|---|---|---|"]
    for name, m in summary["models"].items():
        p = m["primary"]
        cells = ["—"] * 3 if p is None else [
            f"{_ci(p['R'])} (lower {p['R']['lower_one_sided']:+.1f})",
            f"{_ci(p['K'])} (upper {p['K']['upper_one_sided']:+.1f})", _ci(p["D"])]
        star = " (primary)" if name == summary["primary_model"] else ""
        lines.append(f"| `{name}`{star} ({m['layout']}) | {len(m['seeds_included'])}/{len(m['runs'])} | "
                     + " | ".join(cells) + f" | {m['verdict']} |")
    lines += ["", "Control, r = K - 1 against r = K (both expected to fall):", "",
              "| model | Delta_R | Delta_K | D |", "|---|---|---|---|"]
    for name, m in summary["models"].items():
        c = m["control"]
        lines.append(f"| `{name}` (r = {m['K'] - 1}) | " + " | ".join(
            _ci(None if c is None else c[x]) for x in ("R", "K", "D")) + " |")
    lines += ["", "Per seed (r = K accuracy: reasoning over the trained hops / knowledge; changes at r = 2K, "
              "with items gained / lost):", "",
              "| model | seed | included | reasoning (trained hops) at K | knowledge at K | Delta_R (+/-) | "
              "Delta_K (+/-) | D |", "|---|---|---|---|---|---|---|---|"]
    for name, m in summary["models"].items():
        at = m["loops"].index(m["K"])
        for seed, r in m["runs"].items():
            t = r["target"]
            know = r["accuracy"][plan["knowledge_task"]][at]
            included = "yes" if r["included"] else "no: " + "; ".join(r["excluded_because"])
            lines.append(f"| `{name}` | {seed} | {included}"
                         f" | {r['reasoning_trained_at_K']:.1f} | {know:.1f} | {t['R']:+.1f} ({t['R_gained']}/"
                         f"{t['R_lost']}) | {t['K']:+.1f} ({t['K_gained']}/{t['K_lost']}) | {t['D']:+.1f} |")
    lines += ["", "Delta_R per hop at r = 2K (95 % interval; hops "
              + ", ".join(map(str, next(iter(summary["models"].values()))["trained_hops"])) + " trained):", ""]
    hops = next(iter(summary["models"].values()))["hops"]
    lines += ["| model | " + " | ".join(f"hop {h}" for h in hops) + " |", "|---|" + "---|" * len(hops)]
    for name, m in summary["models"].items():
        lines.append(f"| `{name}` | " + " | ".join(
            _ci(None if m["per_hop_target"][str(h)] is None else m["per_hop_target"][str(h)]["R"]) for h in hops)
            + " |")
    for name, m in summary["models"].items():
        lines += ["", f"`{name}` ({m['layout']}, K = {m['K']}) over r, mean over included seeds (accuracy %; "
                  "change vs r = K with 95 % interval; held-out loss):", "",
                  "| r | " + " | ".join(map(str, m["loops"])) + " |", "|---|" + "---|" * len(m["loops"])]
        for label, task in (("reasoning", plan["reasoning_task"]), ("knowledge", plan["knowledge_task"])):
            row = [("—" if s is None else f"{s['mean']:.1f}") for s in m["mean_accuracy"][task]]
            lines.append(f"| {label} | " + " | ".join(row) + " |")
        for h in m["hops"]:
            row = [("—" if s is None else f"{s['mean']:.1f}") for s in m["mean_per_hop"][str(h)]]
            lines.append(f"| hop {h} | " + " | ".join(row) + " |")
        for key, label in (("R", "Delta_R"), ("K", "Delta_K")):
            row = [("—" if c is None else f"{c[key]['mean']:+.1f} [{c[key]['lo95']:+.1f}, {c[key]['hi95']:+.1f}]")
                   for c in m["curves"]]
            lines.append(f"| {label} | " + " | ".join(row) + " |")
        if m["heldout_loss"]:
            lines.append("| held-out loss | " + " | ".join(f"{s['mean']:.3f}" for s in m["heldout_loss"]) + " |")
    return "\n".join(lines) + "\n"


def _post_hoc(summary: dict) -> str:
    """The figures' label of the exploratory reading (PairedPlan.post_hoc_all_runs), '' otherwise."""
    return "POST HOC, every run, no exclusion (not the registered test)\n" if summary["plan"].get("post_hoc") else ""


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def figure_changes(summary: dict, path: Path) -> None:
    """Changes of reasoning and knowledge against r relative to r = K, one panel per allocation,
    95 % hierarchical-bootstrap bands; dashed at K, extrapolation r > K shaded (Fig. 1(a) style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = summary["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.8), squeeze=False)
    for ax, (name, m) in zip(axes[0], models.items()):
        loops = m["loops"]
        plan = summary["plan"]
        for key, label, color in (("R", f"reasoning ({plan['reasoning_task']})", "tab:red"),
                                  ("K", f"knowledge ({plan['knowledge_task']})", "tab:blue")):
            stats = [c[key] if c else None for c in m["curves"]]
            if all(s is None for s in stats):
                continue
            ax.plot(loops, [s["mean"] for s in stats], marker="o", color=color, label=label)
            ax.fill_between(loops, [s["lo95"] for s in stats], [s["hi95"] for s in stats], color=color, alpha=0.2)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axvline(m["K"], color="black", linestyle="--", linewidth=1)
        ax.axvspan(m["K"], loops[-1] + 0.5, color="grey", alpha=0.08)
        star = ", primary" if name == summary["primary_model"] else ""
        n = len(m["seeds_included"])
        ax.set_title(f"{name} ({m['layout']}{star}): {n} seed{'' if n == 1 else 's'} included", fontsize=9)
        ax.set_xlabel("inference loops r (dashed: K; shaded: r > K)")
        ax.set_ylabel("change vs r = K (points), 95 % CI")
        ax.set_ylim(-60, 25)
        ax.grid(alpha=0.3)
    if axes[0][0].get_legend_handles_labels()[0]:  # a model with no included run draws nothing
        axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(_post_hoc(summary) + "Paired item-level change from r = K\n(mean over included seeds; bands: 95 % "
                 "hierarchical bootstrap)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def figure_per_hop(summary: dict, path: Path) -> None:
    """Reasoning accuracy per depth (hops / moves) against r (top row, mean over seeds, Fig. 1(b,c) style; dashed: hops
    beyond training) and Delta_R per hop at r = 2K with 95 % intervals (bottom row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = summary["models"]
    fig, axes = plt.subplots(2, len(models), figsize=(4.6 * len(models), 7.0), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for col, (name, m) in enumerate(models.items()):
        ax = axes[0][col]
        hops = m["hops"]
        for j, h in enumerate(hops):
            stats = m["mean_per_hop"][str(h)]
            if any(s is None for s in stats):
                continue
            trained = h in m["trained_hops"]
            ax.plot(m["loops"], [s["mean"] for s in stats], marker="o", markersize=3,
                    color=cmap(j / max(1, len(hops) - 1)), linestyle="-" if trained else "--",
                    label=f"hop {h}" + ("" if trained else " (untrained)"))
        ax.axhline(m["chance"][summary["plan"]["reasoning_task"]], color="grey", linestyle=":", linewidth=1)
        ax.axvline(m["K"], color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{name} ({m['layout']}): {summary['plan']['reasoning_task']} accuracy by depth", fontsize=9)
        ax.set_xlabel("inference loops r")
        ax.set_ylabel("accuracy (%), mean over seeds")
        ax.set_ylim(0, 102)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax = axes[1][col]
        stats = [m["per_hop_target"][str(h)] for h in hops]
        if all(s is not None for s in stats):
            means = [s["R"]["mean"] for s in stats]
            ax.errorbar(hops, means, yerr=[[mu - s["R"]["lo95"] for mu, s in zip(means, stats)],
                                           [s["R"]["hi95"] - mu for mu, s in zip(means, stats)]],
                        marker="o", capsize=3, linestyle="none", color="tab:red")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axvspan(max(m["trained_hops"] or [0]) + 0.5, max(hops) + 0.5, color="grey", alpha=0.08)
        ax.set_title(f"Delta_R per hop, r = 2K = {2 * m['K']} vs r = K", fontsize=9)
        ax.set_xlabel("hops (shaded: beyond training)")
        ax.set_ylabel("change (points), 95 % CI")
        ax.grid(alpha=0.3)
    if _post_hoc(summary):
        fig.suptitle(_post_hoc(summary).strip(), fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def figure_primary(summary: dict, path: Path) -> None:
    """Delta_R, Delta_K and D per allocation at r = 2K (filled) and at the control r = K - 1 (open),
    with 95 % intervals; the primary model named in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = summary["models"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
    for ax, (key, title) in zip(axes, (("R", "Delta_R (reasoning)"), ("K", "Delta_K (knowledge)"),
                                       ("D", "D = Delta_R - Delta_K"))):
        for y, (name, m) in enumerate(models.items()):
            for stat, offset, face in ((m["primary"], 0.12, "black"), (m["control"], -0.12, "white")):
                if stat is None:
                    continue
                s = stat[key]
                ax.errorbar([s["mean"]], [y + offset], xerr=[[s["mean"] - s["lo95"]], [s["hi95"] - s["mean"]]],
                            marker="o", markerfacecolor=face, color="black", capsize=3)
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("change vs r = K (points), 95 % CI")
        ax.grid(alpha=0.3)
    axes[0].set_yticks(range(len(models)))
    axes[0].set_yticklabels([f"{n} ({m['layout']})" for n, m in models.items()], fontsize=8)
    fig.suptitle(_post_hoc(summary) + "r = 2K (filled) and control r = K - 1 (open); primary: "
                 f"{summary['primary_model']} -> {summary['verdict']}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


FIGURES = {"paired_changes_vs_r.png": figure_changes, "paired_per_hop.png": figure_per_hop,
           "paired_primary.png": figure_primary}


def write_report(summary: dict, run: Path) -> list[Path]:
    """summary.json, summary.md and the figures under ``run``; returns their paths."""
    write_atomic(run / "summary.json", json.dumps(summary, indent=1) + "\n")
    write_atomic(run / "summary.md", markdown(summary))
    paths = [run / "summary.json", run / "summary.md"]
    for name, draw in FIGURES.items():
        draw(summary, run / name)
        paths.append(run / name)
    return paths

