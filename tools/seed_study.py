#!/usr/bin/env python
"""Mean ± standard error over seeds of a seeded CPU study (tools/small_study.sh STUDY).

    python tools/seed_study.py --study finding --run runs/study_finding

Reads ``RUN/NAME-seedS/eval/results.json`` (tools/eval_loops.py) of every twin and seed of the
study (megatron_loop/registry/), and writes ``RUN/summary.json``, ``RUN/summary.md`` (Knowledge,
Reasoning and held-out loss by effective depth L(r), and Reasoning by compositional depth) and
``RUN/knowledge_reasoning_vs_depth.png`` (the paper's Fig. 1 (a) layout: Knowledge / Reasoning
against L(r), one curve per model). The standard error is over seeds: sd / sqrt(n), sd with n - 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from megatron_loop import registry as R
from megatron_loop.atomic import atomic_path, write_atomic
from megatron_loop.errors import LoopConfigError

ROOT = Path(__file__).resolve().parents[1]

GROUPS = (("knowledge", "Knowledge"), ("reasoning", "Reasoning"))


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean over seeds (None for one seed)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def load_results(study: R.Study, run: Path) -> dict[str, list[dict]]:
    """{twin name: [results.json of each seed]}; a missing file is an error naming it."""
    out: dict[str, list[dict]] = {}
    for toy, name, _ in R.toy_copies(study):
        path = run / name / "eval" / "results.json"
        if not path.is_file():
            raise LoopConfigError(f"{path}: missing; run bash tools/small_study.sh {study.name} first")
        out.setdefault(toy.name, []).append(json.loads(path.read_text()))
    return out


def summarise(results: dict[str, list[dict]]) -> dict:
    """Per model: L(K), the L(r) swept, and per group / held-out loss / reasoning depth stratum the
    per-seed values with their mean and standard error at each L(r)."""
    models = {}
    for model, seeds in results.items():
        first = seeds[0]
        loops = [str(r) for r in first["loops"]]
        depth = {r: first["effective_depth"][r] for r in loops}
        entry = {"layout": first["layout"], "training_depth": first["training_depth"], "seeds": len(seeds),
                 "loops": [int(r) for r in loops], "effective_depth": [depth[r] for r in loops]}
        for group, _ in (*GROUPS, ("overall", "Overall")):
            per_seed = [[s["groups"][group][r] for s in seeds] for r in loops]
            entry[group] = [dict(zip(("mean", "se"), mean_se(v)), values=v) for v in per_seed]
        losses = [[s["heldout"][r]["loss"] for s in seeds] for r in loops if r in first.get("heldout", {})]
        entry["heldout_loss"] = [dict(zip(("mean", "se"), mean_se(v)), values=v) for v in losses]
        strata = {}  # results.json per_depth: {task: {r: {depth: {accuracy, ...}}}}
        for task, by_loops in first.get("per_depth", {}).items():
            strata[task] = {d: [dict(zip(("mean", "se"), mean_se([s["per_depth"][task][r][d]["accuracy"]
                                                                  for s in seeds]))) for r in loops]
                            for d in by_loops[loops[0]]}
        entry["per_depth"] = strata
        models[model] = entry
    chance = next(iter(results.values()))[0]["groups_chance"]
    return {"models": models, "chance": chance}


def _cell(stat: dict, digits: int = 1) -> str:
    se = "" if stat["se"] is None else f" ± {stat['se']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}{se}"


def markdown(summary: dict) -> str:
    """Tables: each group by L(r) (training depth in bold), held-out loss, reasoning by depth at L(K)."""
    models = summary["models"]
    depths = sorted({d for m in models.values() for d in m["effective_depth"]})
    lines = []
    for group, title in GROUPS:
        lines += [f"{title} (%, mean ± standard error over seeds; chance {summary['chance'][group]:.1f}):", "",
                  "| model | " + " | ".join(f"L={d}" for d in depths) + " |",
                  "|---|" + "---|" * len(depths)]
        for name, m in models.items():
            cells = {d: _cell(s) for d, s in zip(m["effective_depth"], m[group])}
            row = [f"**{cells[d]}**" if d == m["training_depth"] and d in cells else cells.get(d, "") for d in depths]
            lines.append(f"| `{name}` ({m['layout']}, {m['seeds']} seeds) | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["Held-out loss (nats/token, mean ± standard error over seeds):", "",
              "| model | " + " | ".join(f"L={d}" for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for name, m in models.items():
        cells = {d: _cell(s, 3) for d, s in zip(m["effective_depth"], m["heldout_loss"])}
        lines.append(f"| `{name}` | " + " | ".join(cells.get(d, "") for d in depths) + " |")
    lines.append("")
    for task in sorted({t for m in models.values() for t in m["per_depth"]}):
        strata = sorted({int(d) for m in models.values() for d in m["per_depth"].get(task, {})})
        lines += [f"`{task}` accuracy (%) by compositional depth at each model's training depth L(K), "
                  "mean ± standard error over seeds:", "",
                  "| model | " + " | ".join(f"depth {d}" for d in strata) + " |", "|---|" + "---|" * len(strata)]
        for name, m in models.items():
            at = m["effective_depth"].index(m["training_depth"])
            row = [_cell(m["per_depth"][task][str(d)][at]) for d in strata]
            lines.append(f"| `{name}` (L = {m['training_depth']}) | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def figure(summary: dict, path: Path) -> None:
    """Knowledge and Reasoning against L(r), one curve per model (error bars: standard error over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, (group, title) in zip(axes, GROUPS):
        for name, m in summary["models"].items():
            stats = m[group]
            yerr = [s["se"] or 0.0 for s in stats]
            style = dict(marker="s", markersize=8, linestyle="none") if len(stats) == 1 else dict(marker="o")
            line = ax.errorbar(m["effective_depth"], [s["mean"] for s in stats], yerr=yerr, capsize=3,
                               label=f"{name} ({m['layout']})", **style)
            if len(stats) > 1:
                at = m["effective_depth"].index(m["training_depth"])
                ax.scatter([m["training_depth"]], [stats[at]["mean"]], s=90, facecolors="none",
                           edgecolors=line[0].get_color(), zorder=3)
        ax.axhline(summary["chance"][group], color="grey", linestyle="--", linewidth=1, label="chance")
        ax.set_title(title)
        ax.set_xlabel("effective depth L(r)")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Knowledge vs reasoning against effective depth (mean ± s.e. over seeds; circled: L(K))")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True, help="a study with seeds (tools/generate_configs.py --list-studies)")
    ap.add_argument("--run", required=True, help="the study's output folder (STUDY_RUN of tools/small_study.sh)")
    a = ap.parse_args(argv)
    try:
        if a.study in R.STUDIES and R.STUDIES[a.study].paired is not None:
            raise LoopConfigError(f"--study {a.study!r}: a paired study; analyse it with tools/paired_study.py "
                                  f"analyse --study {a.study} --run RUN")
        if a.study not in R.STUDIES or not R.STUDIES[a.study].seeds:
            seeded = ", ".join(s.name for s in R.STUDY_LIST if s.seeds and s.paired is None)
            raise LoopConfigError(f"--study {a.study!r}: expected a study with seeds ({seeded})")
        run = Path(a.run)
        summary = summarise(load_results(R.STUDIES[a.study], run))
    except LoopConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, text in (("summary.json", json.dumps(summary, indent=1) + "\n"), ("summary.md", markdown(summary))):
        write_atomic(run / name, text)
    figure(summary, run / "knowledge_reasoning_vs_depth.png")
    print(markdown(summary))
    print(f"wrote {run}/summary.json, summary.md, knowledge_reasoning_vs_depth.png")
    return 0


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))
