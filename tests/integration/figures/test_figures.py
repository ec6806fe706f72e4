"""Every figure the project draws, rendered from small fixture data (Agg, no pixels compared): the
axis labels, titles, legend entries, scales and reference lines a reader needs to read it.

Loop sweeps: models of different layouts share the x axis L(r) = p + r·s + c, the training depth
L(K) and the extrapolation region are marked per model when the models differ, the held-out loss
has a log y and the ln|V| line of a uniform prediction, chance levels are named in titles (not
written over the markers), and the error bars are said to be standard errors. Probes: one legend,
the sample size N and |T| on the figure, the short runs drawn above the long ones, a band of
mean ± standard error (computed by the probe from per-sequence terms), the two configurations of a
comparison named, categorical axes without joining lines. Training curves: run names from the run
folder, the legend in a panel of its own, tokens in millions, gradient-norm and throughput panels,
a log loss axis."""

from __future__ import annotations

import json
import math
import statistics

import matplotlib.pyplot as plt
import pytest
from probe_fixtures import tiny_model, write_prefix

from megatron_loop.eval import plots
from megatron_loop.probes import plots as probe_plots
from megatron_loop.plotting import run_name
from megatron_loop.probes.report import probe_geometry
from megatron_loop.probes.runner import ProbeSettings
from megatron_loop.probes.sampling import ProbeSample, load_probe_sample
from megatron_loop.curves import plot_runs, read_run
from testpaths import REPO


def sweep_results(label: str, p: int, s: int, k: int, c: int, loops, offset: float = 0.0, tasks=None) -> dict:
    """A results.json of tools/eval_loops.py (the keys the figures read) with made-up scores."""
    depth = {r: p + r * s + c for r in loops}
    score = {r: 30.0 + offset + 2 * r for r in loops}
    tasks = tasks or {"clutrr": ["looplm_clutrr_local"], "bbh": ["looplm_tracking_local"],
                      "proofwriter": ["looplm_proofwriter"]}
    return {
        "model": f"runs/{label}/hf", "label": label, "layout": f"{p}+{s}x{k}+{c}", "prelude_layers": p,
        "core_layers": s, "coda_layers": c, "train_loops": k, "vocab_size": 2048, "training_depth": p + k * s + c,
        "loops": list(loops), "effective_depth": depth, "lm_eval_tasks": tasks,
        "groups": {"overall": score, "knowledge": {r: 25.0 for r in loops}, "reasoning": score},
        "groups_stderr": {g: {r: 1.5 for r in loops} for g in ("overall", "knowledge", "reasoning")},
        "groups_chance": {"overall": 31.25, "knowledge": 25.0, "reasoning": 37.5},
        "per_depth": {task: {r: {d: {"accuracy": 10.0 * d + r, "stderr": 2.0, "chance": 25.0, "n": 40}
                                 for d in (1, 2, 3)} for r in loops} for task in tasks},
        "depth_axes": {"clutrr": "relation-chain length", "bbh": "depth", "proofwriter": "proof depth"},
        "trained_depths": {task: [1, 2] for task in tasks},
        "heldout": {r: {"loss": 1.0 + offset / 10 + (20.0 if r == 1 else 0.05 * abs(r - k)), "stderr": 0.01}
                    for r in loops},
    }


BASELOOP = dict(label="base", p=0, s=2, k=3, c=0, loops=range(1, 7))         # L(r) = 2r, L(K) = 6
CORELOOP = dict(label="core", p=0, s=1, k=5, c=1, loops=range(1, 11), offset=1.0)  # L(r) = r + 1, L(K) = 6
SHALLOW = dict(label="shallow", p=1, s=1, k=2, c=1, loops=range(1, 5), offset=2.0)  # L(r) = r + 2, L(K) = 4


def _legend(fig) -> list[str]:
    (legend,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [text.get_text() for text in legend.get_texts()]


def _series_x(ax) -> dict[str, list[int]]:
    """{label: x of its points, undone from the sideways nudge} of every error-bar series."""
    return {c.get_label(): [round(x) for x in c.lines[0].get_xdata()] for c in ax.containers}


def test_loss_figure_puts_every_layout_on_effective_depth_with_log_y_and_uniform_loss():
    base, core = sweep_results(**BASELOOP), sweep_results(**CORELOOP)
    fig = plots.loss_figure([base, core])
    full, zoom = fig.axes
    for ax in (full, zoom):
        assert _series_x(ax) == {"base (0+2x3+0)": [2 * r for r in range(1, 7)],
                                 "core (0+1x5+1)": [r + 1 for r in range(1, 11)]}
        assert ax.get_xlabel() == "effective depth L(r) = p + r·s + c"
    assert full.get_yscale() == "log" and zoom.get_yscale() == "linear"
    assert "mean ± standard error" in full.get_ylabel()
    uniform = [line for line in full.get_lines() if line.get_label().startswith("uniform prediction")]
    assert [line.get_ydata()[0] for line in uniform] == [pytest.approx(math.log(2048))]
    legend = _legend(fig)
    assert "uniform prediction: ln|V| = ln 2,048 = 7.62" in legend
    # the tokenizer's |V| where the sweep recorded it (the model's vocab_size is padded above it)
    small = plots.loss_figure([{**base, "tokenizer_vocab_size": 1265}])
    assert "uniform prediction: ln|V| = ln 1,265 = 7.14" in _legend(small)
    # one training depth for both (L(K) = 6): one line, one shaded region starting at it
    assert legend.count("training depth L(K) = 6") == 1 and "extrapolation L(r) > L(K) (r > K)" in legend
    assert not any(text.startswith("training loops") for text in legend)
    # the zoom shows every r >= K point and says how many of the others it leaves to (a)
    low, high = zoom.get_ylim()
    assert all(low <= cell["loss"] <= high for res in (base, core) for r, cell in res["heldout"].items() if r >= 3)
    assert zoom.get_title() == "(b) zoom on r ≥ K, linear y (2 points above: see (a))"
    plt.close(fig)
    assert plots.loss_figure([base], log_y=False).axes[0].get_yscale() == "linear"
    plt.close("all")


def test_models_with_different_training_depths_are_marked_each_in_its_colour():
    base, shallow = sweep_results(**BASELOOP), sweep_results(**SHALLOW)
    for fig in (plots.groups_figure([base, shallow]), plots.loss_figure([base, shallow])):
        legend = _legend(fig)
        assert {"L(K) = 6: base (0+2x3+0)", "L(K) = 4: shallow (1+1x2+1)",
                "extrapolation (r > K): base (0+2x3+0)", "extrapolation (r > K): shallow (1+1x2+1)"} <= set(legend)
        assert "extrapolation L(r) > L(K) (r > K)" not in legend  # no region shared by models it does not fit
        ax = fig.axes[0]
        marks = {line.get_label(): line for line in ax.get_lines() if line.get_label().startswith("L(K)")}
        assert marks["L(K) = 6: base (0+2x3+0)"].get_xdata()[0] == 6
        assert marks["L(K) = 4: shallow (1+1x2+1)"].get_color() == ax.containers[1].lines[0].get_color()
        strips = {patch.get_label(): patch.get_x() for patch in ax.patches if patch.get_label().startswith("extra")}
        assert strips == {"extrapolation (r > K): base (0+2x3+0)": 6, "extrapolation (r > K): shallow (1+1x2+1)": 4}
        plt.close(fig)


def test_groups_figure_names_chance_in_titles_and_standard_errors_on_the_axis():
    base, core = sweep_results(**BASELOOP), sweep_results(**CORELOOP)
    fig = plots.groups_figure([base, core])
    assert [ax.get_title() for ax in fig.axes] == ["Overall (chance 31.2%)", "Knowledge (chance 25.0%)",
                                                   "Reasoning (chance 37.5%)"]
    assert fig.axes[0].get_ylabel() == "accuracy (%), mean ± standard error"
    assert all(not ax.texts for ax in fig.axes)  # no value written inside the axes, over the markers
    legend = _legend(fig)  # one legend for the three panels, each entry once
    assert sorted(legend) == sorted(["base (0+2x3+0)", "core (0+1x5+1)", "chance level (mean 1/#choices)",
                                     "training depth L(K) = 6", "extrapolation L(r) > L(K) (r > K)"])
    for ax in fig.axes:  # a model keeps its colour in every panel
        assert [c.lines[0].get_color() for c in ax.containers] == ["C0", "C1"]
    plt.close(fig)
    # no knowledge task evaluated: no empty Knowledge panel
    reasoning_only = {**base, "groups": {**base["groups"], "knowledge": {r: None for r in base["loops"]}}}
    fig = plots.groups_figure([reasoning_only])
    assert [ax.get_title().split(" (")[0] for ax in fig.axes] == ["Overall", "Reasoning"]
    assert all(ax.containers for ax in fig.axes)
    plt.close(fig)


def test_per_depth_titles_name_the_task_the_items_and_the_model():
    res = sweep_results(**BASELOOP)
    titles = {}
    for task in ("clutrr", "bbh", "proofwriter"):
        fig = plots.per_depth_figure(res, task)
        titles[task] = fig.axes[0].get_title()
        assert fig.axes[0].get_ylabel() == "accuracy (%), mean ± standard error" and not fig.axes[0].texts
        assert {"relation-chain length 1 (trained)", "relation-chain length 3 (not in training)"} <= set(
            _legend(fig)) or task != "clutrr"
        plt.close(fig)
    assert titles == {
        "clutrr": "CLUTRR-style (bundled): accuracy by relation-chain length\nbase (0+2x3+0), chance 25.0%",
        "bbh": "tracking-style (bundled, in the BBH slot): accuracy by depth\nbase (0+2x3+0), chance 25.0%",
        "proofwriter": "ProofWriter: accuracy by proof depth\nbase (0+2x3+0), chance 25.0%"}


# ------------------------------------------------------------------------------------------ probes
@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(sample, report of 1+2x3+1 at r = 1, 3, 6 named 'a', the same layout probed as reference 'b')."""
    root = tmp_path_factory.mktemp("figures")
    sample = load_probe_sample(write_prefix(root), 13, 3, None)
    settings = ProbeSettings(loops=[1, 3, 6], sources="beyond_training", progress=False)
    reference = probe_geometry(tiny_model(prelude=1, coda=1, seed=1), sample, settings, label="b")
    report = probe_geometry(tiny_model(prelude=1, coda=1), sample, settings, label="a",
                            reference=json.loads(json.dumps(reference)))
    return sample, report


def test_probe_spread_is_the_standard_error_over_the_sequences(probed):
    """angle_stderr = stdev of the per-sequence angles / sqrt(N): each sequence probed alone gives its term."""
    sample, report = probed
    model = tiny_model(prelude=1, coda=1)
    alone = [probe_geometry(model, ProbeSample(sample.tokens[n:n + 1], sample.mask[n:n + 1]),
                            ProbeSettings(loops=[3], sources="none", progress=False))["loops"]["3"]
             for n in range(sample.num_sequences)]
    result = report["loops"]["3"]
    for path in (("block", "angle"), ("loop", "angle"), ("loop", "relative_update")):
        terms = list(zip(*[one[path[0]][path[1]] for one in alone]))
        expected = [statistics.stdev(t) / math.sqrt(len(t)) for t in terms]
        assert result[path[0]][f"{path[1]}_stderr"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert result[path[0]][path[1]] == pytest.approx([statistics.mean(t) for t in terms], rel=1e-9)


def test_trajectory_figure_one_legend_sample_size_bands_and_short_runs_on_top(probed):
    _, report = probed
    fig = probe_plots.trajectory_figure(report)
    assert fig._suptitle.get_text() == "a (1+2x3+1, I(scalar)+LG): geometry probes (App. C.4) on N = 3 sequences of 13 tokens, " \
                                       "|T| = 36 positions"
    legend = _legend(fig)  # one legend for the four panels
    assert legend[:3] == ["r=1, L(r)=4", "r=3, L(r)=8", "r=6, L(r)=14"]
    assert {"coda block", "training loops t = K = 3", "$V(x^{(t)}) = V(x^{(K)})$",
            "band: mean ± standard error over the N sequences ((d): over the |T| positions)"} <= set(legend)
    block = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert block["r=1, L(r)=4"].get_zorder() > block["r=3, L(r)=8"].get_zorder() > block["r=6, L(r)=14"].get_zorder()
    deep = report["loops"]["6"]
    (band,) = [c for c in fig.axes[0].collections if c.get_zorder() == block["r=6, L(r)=14"].get_zorder() - 0.5]
    ys = band.get_paths()[0].vertices[:, 1]
    assert max(ys) == pytest.approx(max(a + e for a, e in zip(deep["block"]["angle"], deep["block"]["angle_stderr"])))
    assert fig.axes[2].get_yscale() == "log" and fig.axes[3].get_yscale() == "log"
    plt.close(fig)
    fig = probe_plots.interaction_figure(report)
    assert fig._suptitle.get_text() == "a (1+2x3+1, I(scalar)+LG): computational interaction by loop lag, N = 3 sequences of " \
                                       "13 tokens, |T| = 36 positions"
    assert _legend(fig) == ["r=6, L(r)=14"] and fig.axes[0].get_xlabel() == "loop lag $d$"
    plt.close(fig)


def test_comparison_figure_names_both_models_and_draws_categories_as_points(probed):
    _, report = probed
    fig = probe_plots.comparison_figure(report)
    assert fig._suptitle.get_text().startswith("A = a (1+2x3+1, I(scalar)+LG) over B = b (1+2x3+1, I(scalar)+LG) (--reference-json)")
    quantities, pairs = fig.axes[1], fig.axes[2]
    assert [t.get_text().split(":")[0] for t in quantities.get_xticklabels()] == ["C", "N", "B"]
    for ax in (quantities, pairs):
        data = [line for line in ax.get_lines() if line.get_label().startswith("r=")]
        assert data and all(line.get_linestyle() == "None" for line in data)  # no line joins categories
    legend = _legend(fig)
    assert {"equal (A / B = 1)", "boundary between source blocks s"} <= set(legend)
    boundary = [line for line in pairs.get_lines() if line.get_label() == "boundary between source blocks s"]
    assert list(boundary[0].get_xdata()) == [1.5, 1.5]  # between source block 1 (1:1, 1:2) and 2 (2:1, 2:2)
    plt.close(fig)


def test_runs_are_named_after_their_run_folder(tmp_path):
    assert run_name(str(tmp_path / "runs" / "demo" / "train" / "checkpoints" / "global_step600")) == "demo"
    assert run_name(str(tmp_path / "runs" / "study" / "baseloop_2x3" / "hf")) == "baseloop_2x3"


# ----------------------------------------------------------------------------------- training curves
def _metrics(folder, losses):
    folder.mkdir(parents=True)
    lines = [{"event": "train", "step": i, "tokens": 400_000 * i, "loss": loss, "lr_muon": 1e-3, "lr_adamw": 1e-3,
              "grad_norm": 2.0 / i, "tokens_per_s": 1000.0 * i, "mfu": 0.01} for i, loss in enumerate(losses, 1)]
    lines.append({"event": "eval", "step": 2, "val_loss_r1": 9.0, "val_loss_r3": 2.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_training_curves_label_runs_by_folder_and_keep_the_legend_off_the_data(tmp_path):
    _metrics(tmp_path / "runs" / "small" / "train", [7.6, 3.0, 2.0, 1.5])
    _metrics(tmp_path / "runs" / "big" / "train", [7.6, 2.5, 1.8])
    fig = plot_runs([read_run(tmp_path / "runs" / "small" / "train"),
                     read_run(tmp_path / "runs" / "big" / "train" / "metrics.jsonl")], x="tokens")
    loss_ax, lr_ax, grad_ax, speed_ax, mfu_ax, legend_ax = fig.axes
    assert [ax.get_title() for ax in fig.axes[:5]] == ["Loss (log scale)", "Learning rate", "Gradient norm (log scale)",
                                                       "Throughput", "Model FLOPs utilisation"]
    assert all(ax.get_xlabel() == "tokens (M)" for ax in fig.axes[:5])
    assert list(loss_ax.get_lines()[0].get_xdata()) == [0.4, 0.8, 1.2, 1.6]
    assert loss_ax.get_yscale() == "log" and grad_ax.get_yscale() == "log"
    assert list(grad_ax.get_lines()[1].get_ydata()) == [2.0, 1.0, 2.0 / 3]
    assert list(speed_ax.get_lines()[0].get_ydata()) == [1000.0, 2000.0, 3000.0, 4000.0]
    assert speed_ax.get_ylabel() == "tokens / s (all ranks)"
    legend = _legend(fig)
    assert legend_ax.get_legend() is not None and not legend_ax.get_lines() and not legend_ax.axison
    assert legend == ["small: training loss", "small: validation loss at r = 1", "small: validation loss at r = 3",
                      "big: training loss", "big: validation loss at r = 1", "big: validation loss at r = 3",
                      "small: learning rate (Muon = AdamW)", "big: learning rate (Muon = AdamW)"]
    plt.close(fig)


def test_training_curves_name_runs_by_what_they_are_and_draw_the_warmup_logged_every_ten_steps(tmp_path):
    """The start event training logs (training/banner.py start_record, here from a real WSD scheduler)
    names the run NAME (p+sxK+c, conditioning) and carries its schedule: the lr panel draws every
    step, warmup included, although the run logged its lr only every 10 steps (dots on the line)."""
    import torch

    from megatron_loop.config import config_from_dict
    from megatron_loop.optim.schedule import wsd_lambda, wsd_scheduler, wsd_split
    from megatron_loop.training.banner import start_record

    cfg = config_from_dict({"model": {"prelude_layers": 1, "core_layers": 2, "train_loops": 3, "coda_layers": 1,
                                      "history_injection": "scalar", "history_window": 2, "timestep": "loop_gating"},
                            "train": {"output_dir": str(tmp_path / "runs" / "loopy" / "train"), "lr": 0.01}})
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "name": n} for n in ("muon", "adamw")]
    optimizer = torch.optim.SGD(groups, lr=0.01)
    lines = [start_record(cfg, wsd_scheduler(optimizer, 100), optimizer, 0, 100)]
    lines += [{"event": "train", "step": s, "loss": 3.0, "lr_muon": 0.01 * wsd_lambda(s, *wsd_split(100)),
               "lr_adamw": 0.01 * wsd_lambda(s, *wsd_split(100))} for s in range(10, 101, 10)]
    folder = tmp_path / "runs" / "loopy" / "train"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = read_run(folder)
    assert run.label == "loopy (1+2x3+1, H(scalar, w=2)+LG)"
    fig = plot_runs([run])
    schedule, logged = fig.axes[1].get_lines()
    assert list(schedule.get_xdata()) == list(range(1, 101))
    assert list(schedule.get_ydata()[:6]) == pytest.approx([0.002, 0.004, 0.006, 0.008, 0.01, 0.01])  # warmup 5
    assert schedule.get_ydata()[-1] == pytest.approx(0.001)  # the last update at 0.1 x peak
    assert list(logged.get_xdata()) == list(range(10, 101, 10)) and logged.get_linestyle() == "None"
    assert _legend(fig)[-2:] == ["loopy (1+2x3+1, H(scalar, w=2)+LG): learning rate at every step (Muon = AdamW)",
                                 "loopy (1+2x3+1, H(scalar, w=2)+LG): learning rate as logged (every "
                                 "train.log_interval steps)"]
    plt.close(fig)


# ------------------------------------------------------------------------------- docs/figures
def test_docs_figures_are_drawn_from_the_reproduce_tables(tmp_path):
    """tools/docs_figures.py reads the numbers of docs/REPRODUCE.md's tables into the figures: the
    CoreLoop's r = 5 lands at L = 6 next to the BaseLoops' r = 3, with the table's score ± stderr."""
    import importlib.util

    root = REPO
    spec = importlib.util.spec_from_file_location("docs_figures", root / "tools" / "docs_figures.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    lines = (root / "docs" / "REPRODUCE.md").read_text().splitlines()
    study: dict = {}
    tool.read_groups(lines, study)
    tool.read_loss(lines, "Held-out loss (nats/token) by loop count r", study)
    core = study["coreloop_0+1x5+1"]
    assert core["training_depth"] == 6 and core["effective_depth"][5] == 6 and core["effective_depth"][10] == 11
    row = next(x for x in lines if x.startswith("| `coreloop_0+1x5+1` | 27.3"))  # the Overall table
    assert f"**{core['groups']['overall'][5]} ± {core['groups_stderr']['overall'][5]}**" in row
    assert core["groups_chance"] == {"knowledge": 25.0, "reasoning": 36.1, "overall": 33.3}
    assert study["nonloop_6x1"]["heldout"] == {1: {"loss": 1.094, "stderr": None}}
    fig = plots.loss_figure(list(study.values()))
    assert _series_x(fig.axes[0])["coreloop_0+1x5+1 (0+1x5+1)"] == list(range(2, 12))
    plt.close(fig)
    assert tool.main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depth_loss_vs_loops.png", "study_groups_vs_depth.png",
                                                          "study_loss_vs_loops.png"]
