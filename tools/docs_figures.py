#!/usr/bin/env python
"""Redraw the figures of docs/REPRODUCE.md from the numbers its tables give, with the project's
own plotting code (megatron_loop/eval/plots.py).

    python tools/docs_figures.py                       # docs/REPRODUCE.md -> docs/figures/
    python tools/docs_figures.py --doc D --output-dir F

The results JSONs behind those tables (runs/study/NAME/eval/results.json, runs/depth/...) are
outputs of tools/small_study.sh and tools/depth_study.sh and are not kept in the repository; the
tables are, so the figures are drawn from them and always show the numbers the page states:

* study_groups_vs_depth.png: the Knowledge / Reasoning / Overall tables (accuracy ± standard error
  at each L(r), the chance level of each table's heading);
* study_loss_vs_loops.png, depth_loss_vs_loops.png: the held-out loss tables (the tables give no
  standard errors, so these have no error bars).

Each model's layout p+s×K+c is read from its name (``baseloop_2x3``, ``coreloop_0+1x5+1``), or
from LAYOUTS for the variable-depth runs, whose names do not carry it. The vocabulary size, for
the ln|V| line, is the bundled tokenizer's (tools/pipeline.sh: --vocab-size 2048). Figures that
need data the tables do not hold (per-depth accuracy, probes) come from the run folders instead
(docs/REPRODUCE.md says which run and command made each).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


VOCAB_SIZE = 2048  # tools/pipeline.sh trains the bundled tokenizer with --vocab-size 2048
LAYOUTS = {"fixed_k3": "0+2x3+0", "sampled_k3_bp2": "0+2x3+0"}  # docs/REPRODUCE.md "Variable depth": BaseLoop 2x3
GROUP_HEADINGS = (("Knowledge", "knowledge"), ("Reasoning", "reasoning"), ("Overall", "overall"))


def layout_of(name: str) -> tuple[int, int, int, int]:
    """(p, s, K, c) from ``coreloop_0+1x5+1`` / ``baseloop_2x3`` style names, else LAYOUTS."""
    text = LAYOUTS.get(name, name)
    full = re.search(r"(\d+)\+(\d+)x(\d+)\+(\d+)", text)
    if full:
        p, s, k, c = map(int, full.groups())
        return p, s, k, c
    plain = re.search(r"(\d+)x(\d+)", text)
    if not plain:
        raise SystemExit(f"error: model {name!r}: no p+sxK+c layout in its name; add it to LAYOUTS")
    s, k = map(int, plain.groups())
    return 0, s, k, 0


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("*").strip() for cell in line.strip().strip("|").split("|")]


def tables_after(lines: list[str], heading: str) -> list[list[list[str]]]:
    """Every Markdown table that follows a line starting with ``heading`` (before the next table)."""
    found = []
    for i, line in enumerate(lines):
        if not line.startswith(heading):
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("|"):
            j += 1
        table = []
        while j < len(lines) and lines[j].startswith("|"):
            if not set(lines[j]) <= set("|-: "):
                table.append(_cells(lines[j]))
            j += 1
        found.append(table)
    return found


def _missing(heading: str):
    raise SystemExit(f"error: no table after a line starting with {heading!r}; expected the tables of "
                     "docs/REPRODUCE.md (a renamed heading must be renamed here too)")


def _model(results: dict, name: str) -> dict:
    if name not in results:
        p, s, k, c = layout_of(name)
        results[name] = {"model": name, "label": name, "layout": f"{p}+{s}x{k}+{c}", "prelude_layers": p,
                         "core_layers": s, "coda_layers": c, "train_loops": k, "training_depth": p + k * s + c,
                         "vocab_size": VOCAB_SIZE, "loops": [], "effective_depth": {}, "heldout": {},
                         "groups": {g: {} for _, g in GROUP_HEADINGS},
                         "groups_stderr": {g: {} for _, g in GROUP_HEADINGS}, "groups_chance": {}}
    return results[name]


def _number(text: str) -> float:
    return float(re.match(r"[-\d.]+", text).group(0))


def read_groups(lines: list[str], results: dict) -> None:
    """The Knowledge / Reasoning / Overall tables: ``L=`` columns, ``score ± stderr`` cells."""
    start = lines.index("## Results")  # the toy study's section; later sections (finding1) have tables of their own
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    lines = lines[start:end]
    for heading, group in GROUP_HEADINGS:
        (table,) = [t for t in tables_after(lines, heading + " (") if t and t[0][0] == "model"] or _missing(heading)
        chance = float(re.search(r"chance ([\d.]+)", next(x for x in lines if x.startswith(heading + " ("))).group(1))
        depths = [int(h.split("=")[1]) for h in table[0][1:]]
        for row in table[1:]:
            res = _model(results, row[0].split()[0].strip("`"))
            p, s, _, c = layout_of(res["model"])
            res["groups_chance"][group] = chance
            for depth, cell in zip(depths, row[1:]):
                if not cell:
                    continue
                r = (depth - p - c) // s
                res["effective_depth"][r] = depth
                score, stderr = (float(x) for x in cell.split("±"))
                res["groups"][group][r], res["groups_stderr"][group][r] = score, stderr


def read_loss(lines: list[str], heading: str, results: dict) -> None:
    """A held-out loss table: ``r=`` columns (``**r=3 (=K)**`` allowed), one number per cell."""
    (table,) = tables_after(lines, heading) or _missing(heading)
    loops = [int(re.search(r"r=(\d+)", h).group(1)) for h in table[0][1:]]
    for row in table[1:]:
        res = _model(results, row[0].split()[0].strip("`"))
        p, s, _, c = layout_of(res["model"])
        for r, cell in zip(loops, row[1:]):
            if cell:
                res["effective_depth"][r] = p + r * s + c
                res["heldout"][r] = {"loss": _number(cell), "stderr": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--doc", default="docs/REPRODUCE.md", help="the page whose tables hold the numbers")
    ap.add_argument("--output-dir", default="docs/figures", help="folder for the PNGs")
    args = ap.parse_args(argv)
    from megatron_loop.eval.plots import plot_groups, plot_loss  # after parsing: --help without matplotlib

    lines = Path(args.doc).read_text().splitlines()
    out = Path(args.output_dir)
    study: dict = {}
    read_groups(lines, study)
    read_loss(lines, "Held-out loss (nats/token) by loop count r", study)
    depth: dict = {}
    read_loss(lines, "Held-out loss (nats/token) against r", depth)
    written = [plot_groups(list(study.values()), out / "study_groups_vs_depth.png"),
               plot_loss([m for m in study.values() if m["heldout"]], out / "study_loss_vs_loops.png"),
               plot_loss(list(depth.values()), out / "depth_loss_vs_loops.png")]
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))
