#!/usr/bin/env python
"""The demo's numbers in README.md and docs/REPRODUCE.md, generated from what the demo printed.

    python tools/demo_docs.py --check                         # the docs' demo blocks equal the recorded numbers
    python tools/demo_docs.py                                 # rewrite those blocks from docs/demo_reference.json
    DEMO_RUN=runs/demo bash tools/demo.sh                     # record: the full demo, then the suite's short one,
    DEMO_RUN=runs/demo_short DEMO_STEPS=24 DEMO_LIMIT=12 bash tools/demo.sh   # (the settings REFERENCE records)
    python tools/demo_docs.py --record runs/demo runs/demo_short   # both into the reference, then the docs

``docs/demo_reference.json`` holds two demos' ``demo_results.json`` (``tools/demo.sh``):

* ``full``: the documented demo (600 steps, 120 items per task): its scores ± standard errors at
  every r, chance levels, per-depth accuracy, held-out and validation losses, wall time, the geometry
  probe's summary (and docs/figures/demo_geometry_*.png are copied from that run);
* ``short``: the shortened demo ``tests/integration/tools/test_demo.py`` runs in the suite (its
  settings are in the record), as the demo prints them (:func:`printed_numbers`).

The docs' demo paragraphs sit between ``<!-- BEGIN demo_docs:NAME -->`` and ``<!-- END
demo_docs:NAME -->`` and are rendered from ``full`` only (:func:`render_blocks`): no number in them is
typed. ``tests/integration/docs/test_docs.py`` runs ``--check``; the demo test runs the short demo
and fails when it prints other numbers than ``short`` records, i.e. when a change to the code
changes what the demo computes: then both demos are run again and recorded (the commands above).
The demo is deterministic on one machine (CPU, one thread per process, fixed seeds).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "demo_reference.json"
DOCS = {"README.md": ("readme",), "docs/REPRODUCE.md": ("reproduce", "geometry")}
FIGURES = ("geometry_trajectory.png", "geometry_interaction.png")  # copied to docs/figures/demo_*.png
KEPT = ("layout", "effective_depth", "groups", "groups_stderr", "groups_chance", "tasks", "tasks_stderr", "chance",
        "per_depth", "heldout_loss", "validation_loss_curve", "settings", "params", "wall_time_s", "cpu_time_s",
        "training_wall_time_s")
NAMES = {"facts": "facts", "clutrr": "CLUTRR-style", "proofwriter": "ProofWriter-style", "bbh": "tracking-style"}
METRICS = {"facts": "acc_norm", "clutrr": "acc_norm", "proofwriter": "acc", "bbh": "acc"}


def printed_numbers(summary: dict) -> dict:
    """The numbers the demo prints, rounded as it prints them: every task's and group's score and
    standard error at every r (2 decimals), the held-out loss per r (2) and the validation loss
    curve (3)."""
    def scores(values: dict, errors: dict) -> dict:
        return {name: {r: [round(v, 2), None if errors[name].get(r) is None else round(errors[name][r], 2)]
                       for r, v in by_r.items() if v is not None} for name, by_r in values.items()}

    return {"tasks": scores(summary["tasks"], summary["tasks_stderr"]),
            "groups": scores(summary["groups"], summary["groups_stderr"]),
            "heldout_loss": {r: round(v, 2) for r, v in summary["heldout_loss"].items()},
            "validation_loss_curve": {step: {r: round(v, 3) for r, v in row.items()}
                                      for step, row in summary["validation_loss_curve"].items()}}


def probe_summary(geometry: dict, k: int) -> dict:
    """What the docs say of the geometry probe: at r = 2K the angle and relative update of each loop,
    the normalised state variance at t = K and 2K; at r = 1 the single loop's angle and update."""
    far, one = geometry["loops"][str(2 * k)]["loop"], geometry["loops"]["1"]["loop"]
    return {"sampling": {key: geometry["sampling"][key] for key in ("num_sequences", "num_positions", "seq_length")},
            "angle": far["angle"], "relative_update": far["relative_update"],
            "normalized_state_variance": far["normalized_state_variance"],
            "r1_angle": one["angle"][0], "r1_relative_update": one["relative_update"][0]}


def record(full: Path, short: Path) -> dict:
    """docs/demo_reference.json from two demo folders (``demo_results.json`` of each), the full one's
    probe figures copied into docs/figures/."""
    big, small = (json.loads((run / "demo_results.json").read_text()) for run in (full, short))
    k = int(big["layout"].split("x")[1].split("+")[0])
    geometry = json.loads((full / big["probe"]).read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    reference = {"full": {**{key: big[key] for key in KEPT}, "train_loops": k, "probe": probe_summary(geometry, k),
                          "recorded": {"date": date.today().isoformat(), "commit": commit.strip() or None}},
                 "short": {"settings": small["settings"], "printed": printed_numbers(small)}}
    for name in FIGURES:
        shutil.copyfile(full / Path(big["probe"]).parent / name, ROOT / "docs" / "figures" / f"demo_{name}")
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")
    return reference


# ----------------------------------------------------------------------------- rendering


def _pct(value: float) -> str:
    return f"{value:.1f}"


def _cell(full: dict, task: str, r: str) -> str:
    value, error = full["tasks"][task].get(r), full["tasks_stderr"][task].get(r)
    return "" if value is None else f"{_pct(value)} ± {_pct(error)}" if error is not None else _pct(value)


def _above(full: dict, task: str, r: str) -> float | None:
    """Standard errors above chance of ``task`` at ``r``."""
    value, error = full["tasks"][task].get(r), full["tasks_stderr"][task].get(r)
    return None if value is None or not error else (value - full["chance"][task]) / error


def _learned(full: dict, k: str) -> list[str]:
    return [t for t in full["tasks"] if (_above(full, t, k) or 0) > 2]


def _at_chance(full: dict) -> list[str]:
    return [t for t in full["tasks"] if all(abs(z) <= 2 for r in full["tasks"][t] if (z := _above(full, t, r)) is not None)]


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded"
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s"


def _list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def readme_block(full: dict) -> str:
    k, settings = str(full["train_loops"]), full["settings"]
    learned = _learned(full, k)
    parts = [f"{_cell(full, t, k)} % on the {NAMES[t]} items (chance {full['chance'][t]:g} %, {_pct(full['tasks'][t]['1'])} "
             "% at r = 1)" for t in learned]
    chance = [NAMES[t] for t in _at_chance(full)]
    text = (f"Measured on the shared 2-core CPU machine ({full['recorded']['date']}, commit {full['recorded']['commit']}; "
            f"{_minutes(full['cpu_time_s'])} of CPU time over all its processes, {_minutes(full['wall_time_s'])} wall "
            f"with other jobs running): at r = K = {k} the demo model ({full['params']:,} parameters, {settings['steps']} "
            "steps) scores " + (_list(parts) if parts else "at chance on every task")
            + (f"; its {_list(chance)} scores stay within two standard errors of chance at every r" if chance else "")
            + f". One training seed and {settings['limit']} items per task: this shows the pipeline end to end and what "
            "the model learned at r = K, not how the scores move over r (`docs/REPRODUCE.md`, demo section).")
    return _wrap(text)


def reproduce_block(full: dict) -> str:
    k, s = str(full["train_loops"]), full["settings"]
    loops = sorted(full["tasks"][next(iter(full["tasks"]))], key=int)
    head = "| task (metric, chance) | " + " | ".join(f"r={r}" + (" = K" if r == k else "") for r in loops) + " |"
    rows = [head, "|" + "---|" * (len(loops) + 1)]
    for task in full["tasks"]:
        cells = [f"**{_cell(full, task, r)}**" if r == k else _cell(full, task, r) for r in loops]
        rows.append(f"| {NAMES[task]} ({METRICS[task]}, {full['chance'][task]:.1f}) | " + " | ".join(cells) + " |")
    losses = [f"{full['heldout_loss'][r]:.2f}" for r in loops]
    rows.append("| held-out loss (nats/token) | " + " | ".join(f"**{v}**" if r == k else v
                                                             for r, v in zip(loops, losses)) + " |")
    intro = (f"`make demo` (`tools/demo.sh`) trains `{s['config']}` ({full['layout']}, {full['params']:,} parameters) "
             f"with `train.lr={s['lr']}` for {s['steps']} steps of 16 x 128 tokens on a demo-sized corpus "
             f"(`make_corpus.py {s['corpus']}`: reasoning training documents of depths 1-2, held-out items of depths "
             f"1-3, no follow-up questions), then sweeps r = 1..{2 * int(k)} on {s['limit']} items per task. Recorded "
             f"{full['recorded']['date']} (commit {full['recorded']['commit']}) on the shared 2-core CPU machine: "
             f"{_minutes(full['cpu_time_s'])} of CPU time over all the script's processes; with other jobs running, "
             f"{_minutes(full['wall_time_s'])} wall for the whole script (training {_minutes(full['training_wall_time_s'])}). "
             "Accuracy (%) ± lm-eval standard error:")
    paragraphs = [_wrap(intro), "\n".join(rows)]
    learned = _learned(full, k)
    trained = re.search(r"--train-max-depth (\d+)", s["corpus"])
    for task in learned:
        depths = full["per_depth"].get(task, {}).get(k, {})
        strata = ", ".join(f"{_pct(cell['accuracy'])} % at depth {d}"
                           + (" (unseen in training)" if trained and task != "facts" and int(d) > int(trained.group(1))
                              else "") for d, cell in sorted(depths.items(), key=lambda x: int(x[0])))
        paragraphs.append(_wrap(
            f"The {NAMES[task]} task is learned at r = K: {_cell(full, task, k)} %, {_above(full, task, k):.1f} standard "
            f"errors above its {full['chance'][task]:g} % chance ({_pct(full['tasks'][task]['1'])} % at r = 1)"
            + (f"; by depth at r = K: {strata}" if strata else "") + "."))
    chance = [NAMES[t] for t in _at_chance(full)]
    if chance:
        paragraphs.append(_wrap(f"{_list(chance)} scores stay within two standard errors of chance at every r."))
    paragraphs.append(_wrap(_one_seed(full, k, learned)))
    return "\n\n".join(paragraphs)


def _one_seed(full: dict, k: str, learned: list[str]) -> str:
    """What one seed can and cannot show, with the demo's own differences beyond K."""
    far = [r for r in sorted(full["tasks"][learned[0]], key=int) if int(r) > int(k)] if learned else []
    moves = "; ".join(
        f"{NAMES[t]} " + ", ".join(f"{full['tasks'][t][r] - full['tasks'][t][k]:+.1f} at r = {r}" for r in far)
        for t in learned)
    text = (f"**What one seed can and cannot show.** One training seed and {full['settings']['limit']} items per task "
            "show that the whole pipeline runs and which tasks the model learned at r = K (scores several standard "
            "errors above chance). They cannot show a direction over r: ")
    if moves:
        text += (f"beyond K the scores move by {moves} points (the standard error of a difference of two such scores "
                 f"is about {max(full['tasks_stderr'][t][k] for t in learned) * 2 ** 0.5:.1f} points), but these "
                 "are one model's answers to one set of items; whether another training seed moves the same way is "
                 "what one seed cannot say. ")
    return text + ("A direction over r needs several seeds and intervals over them: `tools/small_study.sh finding1` "
                   "(3 seeds) and `finding1_paired` (5 seeds, paired item-level intervals) above measure it.")


def geometry_block(full: dict) -> str:
    p, k = full["probe"], full["train_loops"]
    angle, update, variance = p["angle"], p["relative_update"], p["normalized_state_variance"]
    n, t, seq = p["sampling"]["num_sequences"], p["sampling"]["num_positions"], p["sampling"]["seq_length"]
    fig3 = angle[2 * k - 1] < angle[k - 1] and variance[2 * k] > variance[k]
    text = (f"`make demo` probes the demo model at r = 1, K, 2K on every position of {n} validation windows of the "
            f"run's {seq} tokens (N = {n}, |T| = {t:,}; the bands are mean ± standard error over the {n} sequences). "
            f"Figures below: the recorded demo run ({full['recorded']['date']}, commit {full['recorded']['commit']}; "
            "redraw with `python tools/probe_geometry.py --replot runs/demo/model/probe/geometry.json --output DIR`):")
    body = (f"Past the training horizon (r = {2 * k}, loops {k + 1}-{2 * k}) the loop angular distance goes from "
            f"{angle[k - 1]:.3f} at t = K to {angle[2 * k - 1]:.3f} at t = 2K and the relative update norm is "
            + ", ".join(f"{u:.2f}" for u in update[k:2 * k]) + f" over loops {k + 1}-{2 * k}, while the normalised "
            f"state variance goes from 1 at t = K to {variance[2 * k]:.1f} at t = 2K (the telescoping factors g_inj, "
            "g_core, g_mix in `geometry.json` multiply to it exactly)"
            + (", the pattern the paper reports in Fig. 3" if fig3 else "") + f". At r = 1 the single loop moves the "
            f"state by an angle of {p['r1_angle']:.2f} and a relative update of {p['r1_relative_update']:.1f}.")
    figures = "\n".join(f"![{alt}](figures/demo_{name})" for alt, name in
                        zip(("trajectory probes", "computational interaction by loop lag"), FIGURES))
    return "\n\n".join((_wrap(text), figures, _wrap(body)))


RENDER = {"readme": readme_block, "reproduce": reproduce_block, "geometry": geometry_block}


def _wrap(text: str, width: int = 100) -> str:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line])


def _marks(name: str) -> tuple[str, str]:
    return (f"<!-- BEGIN demo_docs:{name} (generated by tools/demo_docs.py from docs/demo_reference.json; "
            "edit the script, not this block) -->", f"<!-- END demo_docs:{name} -->")


def render_blocks(text: str, names: Sequence[str], full: dict, where: str) -> str:
    """``text`` with each named block replaced by its rendering of ``full``."""
    for name in names:
        begin, end = _marks(name)
        pattern = re.compile(re.escape(begin) + r"\n.*?\n" + re.escape(end), re.S)
        if len(pattern.findall(text)) != 1:
            raise SystemExit(f"error: {where}: expected one block {begin} ... {end}")
        text = pattern.sub(lambda _: f"{begin}\n{RENDER[name](full)}\n{end}", text)
    return text


def stale(reference: dict) -> list[str]:
    """The docs whose demo blocks differ from the rendering of ``reference``."""
    return [doc for doc, names in DOCS.items()
            if render_blocks((ROOT / doc).read_text(), names, reference["full"], doc) != (ROOT / doc).read_text()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a doc's demo block differs from the reference")
    ap.add_argument("--record", nargs=2, metavar=("FULL_RUN", "SHORT_RUN"),
                    help="record two demo folders (tools/demo.sh: the full demo and the suite's short one) first")
    args = ap.parse_args(argv)
    if args.record:
        for run in args.record:
            if not (Path(run) / "demo_results.json").is_file():
                print(f"error: --record {run}: no demo_results.json; expected a folder written by tools/demo.sh",
                      file=sys.stderr)
                return 2
    reference = record(*map(Path, args.record)) if args.record else json.loads(REFERENCE.read_text())
    if args.check:
        for doc in stale(reference):
            print(f"error: {doc}: its demo numbers differ from {REFERENCE.relative_to(ROOT)}; run python "
                  "tools/demo_docs.py", file=sys.stderr)
        return 1 if stale(reference) else 0
    for doc, names in DOCS.items():
        path = ROOT / doc
        path.write_text(render_blocks(path.read_text(), names, reference["full"], doc))
    print(f"wrote the demo blocks of {', '.join(DOCS)} from {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
