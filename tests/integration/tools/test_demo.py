"""`make demo`'s pipeline end to end (README's two commands), shortened: the same tools/demo.sh with
fewer training steps and lm-eval items (the settings docs/demo_reference.json records for it). Runs
every stage through its real CLI: corpus, tokenizer, preprocessing, DeepSpeed training, HF export,
loop sweep with lm-eval, geometry probes.

The documented numbers are tied to what the demo prints: the README's and docs/REPRODUCE.md's demo
paragraphs are rendered from docs/demo_reference.json by tools/demo_docs.py (its ``--check`` runs in
tests/integration/docs/test_docs.py), and here the shortened demo must print exactly the numbers that
file records for it. A change that changes what the demo computes fails this test until both demos
are run again and recorded (``python tools/demo_docs.py --record FULL SHORT``, tools/demo_docs.py).

The demo's figures are drawn again from its outputs with the project's figure functions and read
back: every panel has data, every legend lies outside the data axes and inside the figure, the axes
fit the data, the run is named ``NAME (p+sxK+c, conditioning)``, the uniform-loss line is at the
tokenizer's vocabulary, and a CPU run has no MFU panel."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from testpaths import REPO, load_script

pytestmark = pytest.mark.slow

ROOT = REPO
LABEL = "demo (0+2x3+0, H(channel, w=2)+LG"  # the run's name, layout and conditioning (training names it demo)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    short = json.loads((ROOT / "docs" / "demo_reference.json").read_text())["short"]["settings"]
    run = tmp_path_factory.mktemp("demo") / "demo"
    env = dict(os.environ, DEMO_RUN=str(run), DEMO_STEPS=str(short["steps"]), DEMO_LIMIT=str(short["limit"]),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", "tools/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return run, out, short


def test_demo_pipeline_end_to_end(demo):
    run, out, short = demo
    assert "Demo finished" in out.stdout
    summary = json.loads((run / "demo_results.json").read_text())
    assert summary["layout"] == "0+2x3+0"
    assert set(summary["heldout_loss"]) == {"1", "2", "3", "4", "5", "6"}
    assert all(0 < v < 10 for v in summary["heldout_loss"].values())
    loops = {"1", "2", "3", "4", "5", "6"}
    # Knowledge (the bundled facts), Reasoning and Overall at every r, each task with its chance level
    for group in ("knowledge", "reasoning", "overall"):
        assert set(summary["groups"][group]) == loops and None not in summary["groups"][group].values()
    assert set(summary["tasks"]) == {"facts", "clutrr", "proofwriter", "bbh"}
    assert summary["chance"] == {"facts": 25.0, "clutrr": 25.0, "proofwriter": 50.0, "bbh": pytest.approx(100 / 3)}
    assert summary["groups_chance"] == {"knowledge": 25.0, "reasoning": pytest.approx((25 + 50 + 100 / 3) / 3),
                                        "overall": pytest.approx((25 + 25 + 50 + 100 / 3) / 4)}
    assert all(0 < se < 50 for se in summary["groups_stderr"]["overall"].values())
    # the held-out loss curve: validation loss at the eval steps of training, at r = 1, K, 2K
    curve = summary["validation_loss_curve"]
    assert len(curve) >= 2 and all(set(row) == {"1", "3", "6"} for row in curve.values())
    assert "Held-out loss (validation split" in out.stdout
    table = out.stdout[out.stdout.index("Knowledge (facts), Reasoning"):]
    assert all(f"| {group} " in table for group in ("knowledge", "reasoning", "overall"))
    assert "One training seed and 12 items per task: which tasks the model learned at r = K, not a direction" in table
    names = {Path(p).name for p in summary["plots"]}
    assert {"groups_vs_depth.png", "loss_vs_loops.png", "geometry_trajectory.png"} <= names
    # the checkpoint was written through DeepSpeed and exported
    assert (run / "model" / "train" / "checkpoints" / "latest").is_file()
    assert (run / "model" / "hf" / "config.json").is_file()
    metrics = [json.loads(line) for line in (run / "model" / "train" / "metrics.jsonl").open()]
    assert max(m.get("step", 0) for m in metrics) == short["steps"]
    assert summary["settings"]["steps"] == short["steps"] and summary["params"] == 348_616
    assert summary["wall_time_s"] > 0 and summary["training_wall_time_s"] > 0 and summary["cpu_time_s"] > 0


def test_demo_prints_the_numbers_the_docs_record(demo):
    """The shortened demo prints what docs/demo_reference.json records for it (and the docs are rendered
    from that file's full demo): a change in what the demo computes fails here."""
    run, out, _ = demo
    docs = load_script("tools/demo_docs.py")
    printed = docs.printed_numbers(json.loads((run / "demo_results.json").read_text()))
    recorded = json.loads((ROOT / "docs" / "demo_reference.json").read_text())["short"]["printed"]
    assert printed == recorded, ("the demo prints other numbers than docs/demo_reference.json records: run the full "
                                 "and the short demo again and record them (tools/demo_docs.py --record)")
    # what the console shows is those numbers (the group rows of the printed table)
    overall = printed["groups"]["overall"]["3"]
    assert f"{overall[0]:.2f} ± {overall[1]:.2f}" in out.stdout[out.stdout.index("Knowledge (facts), Reasoning"):]


# ----------------------------------------------------------------------------------------- figures


def _data_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.axison]


def _has_data(ax) -> bool:
    finite = [line for line in ax.get_lines() if any(math.isfinite(float(y)) for y in line.get_ydata())]
    return bool(finite or ax.containers or ax.collections)


def _fits(ax) -> bool:
    """The data fill the axes: nothing outside the limits, and x spans at least half the axis where the data
    has a span (no lone point on a wide axis, no line squeezed into a corner)."""
    xs = [float(x) for line in ax.get_lines() if line.get_transform() == ax.transData
          for x, y in zip(line.get_xdata(), line.get_ydata()) if math.isfinite(float(x)) and math.isfinite(float(y))]
    if not xs:
        return True
    low, high = sorted(ax.get_xlim())
    inside = all(low - 1e-9 <= x <= high + 1e-9 for x in xs)
    return inside and (max(xs) == min(xs) or (max(xs) - min(xs)) / (high - low) >= 0.5)


def figure_problems(fig, name: str) -> list[str]:
    """Every way ``fig`` fails the paper-figure checks, named."""
    fig.canvas.draw()
    problems = []
    data = _data_axes(fig)
    for i, ax in enumerate(data):
        if not _has_data(ax):
            problems.append(f"{name}: panel {i} ({ax.get_title()!r}) is empty")
        if not _fits(ax):
            problems.append(f"{name}: panel {i} ({ax.get_title()!r}): axes {ax.get_xlim()} do not fit the data")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    if not legends:
        problems.append(f"{name}: no legend")
    figure_box = fig.bbox.expanded(1.0, 1.0)
    for legend in legends:
        box = legend.get_window_extent()
        for ax in data:
            if box.overlaps(ax.get_window_extent()):
                problems.append(f"{name}: a legend covers panel {ax.get_title()!r}")
        if box.x0 < figure_box.x0 - 2 or box.x1 > figure_box.x1 + 2 or box.y0 < figure_box.y0 - 2 \
                or box.y1 > figure_box.y1 + 2:
            problems.append(f"{name}: a legend is cut off by the figure's edge")
    return problems


def _texts(fig) -> str:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return "\n".join([t.get_text() for legend in legends for t in legend.get_texts()]
                     + [ax.get_title() for ax in fig.axes] + ([fig._suptitle.get_text()] if fig._suptitle else []))


def test_demo_figures_read_back(demo):
    from transformers import AutoTokenizer

    from megatron_loop.eval import plots
    from megatron_loop.eval.report import read_results
    from megatron_loop.probes import plots as probe_plots
    from megatron_loop.probes.report import read_report
    from megatron_loop.curves import plot_dynamics, plot_runs, read_run

    run, _, _ = demo
    results = read_results(run / "model" / "eval" / "results.json")
    report = read_report(run / "model" / "probe" / "geometry.json", "--replot")
    curves = read_run(run / "model" / "train")
    figures = {"groups_vs_depth": plots.groups_figure([results]), "loss_vs_loops": plots.loss_figure([results]),
               **{f"per_depth_{task}": plots.per_depth_figure(results, task) for task in results["per_depth"]},
               "geometry_trajectory": probe_plots.trajectory_figure(report),
               "geometry_interaction": probe_plots.interaction_figure(report),
               "curves": plot_runs([curves])}
    dynamics = plot_dynamics([curves])  # a 24-step run records no loop dynamics (every 250 steps)
    assert dynamics is None
    problems = [p for name, fig in figures.items() for p in figure_problems(fig, name)]
    assert problems == []
    for name, fig in figures.items():  # each names the run as training did: NAME (p+sxK+c, conditioning)
        assert LABEL in _texts(fig), (name, _texts(fig))
    vocabulary = len(AutoTokenizer.from_pretrained(run / "tokenizer"))
    assert f"uniform prediction: ln|V| = ln {vocabulary:,} = " in _texts(figures["loss_vs_loops"])
    assert vocabulary < results["vocab_size"]  # the model's vocab_size is padded above the tokenizer's
    assert "Model FLOPs utilisation" not in _texts(figures["curves"])  # CPU: no MFU logged, no empty panel
    plt.close("all")
