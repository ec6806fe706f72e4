"""Loop-sweep figures (matplotlib, Agg backend, PNG).

* :func:`plot_groups` -- Overall / Knowledge / Reasoning against effective depth L(r), one
  line per model, dashed vertical line at the training depth L(K) and the extrapolation
  region L(r) > L(K) shaded (paper Fig. 2 style).
* :func:`plot_per_depth` -- accuracy per proof depth / chain length against L(r), one line
  per depth (Fig. 1 b,c style); depths the task declares as trained are marked in the legend.
* :func:`plot_loss` -- held-out loss against L(r), log y by default, with the loss of a
  uniform prediction, ln|V|, as a reference line.

Notation shared with the probe figures: r is the inference loop count, K the training loop
count, L(r) = p + r·s + c the effective depth. Every figure puts models of different layouts on
the same x axis, L(r), so a CoreLoop's r = 5 lines up with a BaseLoop's r = 3 when both are
L = 6 layers deep. Where the models share their training depth L(K), one dashed line marks it
and the region beyond is shaded as extrapolation (r > K); where they do not, each model gets
its own dashed line and a strip of shading in its colour along the bottom of the axes.
Every score point is the mean with its standard error (lm-eval's) as an error bar, as the y
labels say; every score panel has a dotted line at the chance level of its items, whose value
the title gives. Series are told apart by colour, marker and line style and nudged sideways
a little, so equal values do not hide each other. Each ``*_figure`` function returns the Figure
(tests read the plotted numbers back from it); ``plot_*`` save it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from megatron_loop import plotting
from megatron_loop.atomic import atomic_path

PANELS = (("overall", "Overall"), ("knowledge", "Knowledge"), ("reasoning", "Reasoning"))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")
DODGE = 0.12  # sideways offset between series, in effective-depth units (points stay on their integer L(r))
DEPTH_AXIS = "effective depth L(r) = p + r·s + c"
ACCURACY_AXIS = "accuracy (%), mean ± standard error"
LOSS_AXIS = "held-out loss (nats / token), mean ± standard error"
CHANCE = "chance level (mean 1/#choices)"
EXTRAPOLATION = "extrapolation L(r) > L(K) (r > K)"
# Display names of the task keys (App. C.3 spelling); a bundled stand-in is named after its own items.
TASK_NAMES = {"sciq": "SciQ", "arc_easy": "ARC-Easy", "piqa": "PIQA", "arc_challenge": "ARC-Challenge",
              "winogrande": "WinoGrande", "openbookqa": "OpenBookQA", "hellaswag": "HellaSwag",
              "commonsense_qa": "CommonsenseQA", "proofwriter": "ProofWriter", "clutrr": "CLUTRR", "bbh": "BBH",
              "facts": "facts (bundled knowledge items)"}
BUNDLED_NAMES = {"clutrr": "CLUTRR-style", "proofwriter": "ProofWriter-style", "tracking": "tracking-style"}


def model_label(results: dict) -> str:
    """What the model is: the sweep's ``--label`` (else its folder) with its layout p+s×K+c (so K is
    on the figure), its conditioning in the paper's notation (``H(channel, w=2)+LG``) and the items
    per task n (so runs of different ``--limit`` are told apart), as far as the results record them."""
    name = results.get("label") or plotting.run_name(results["model"])  # NAME of runs/NAME/hf
    facts = [results["layout"]] if results.get("layout") and results["layout"] != name else []
    if results.get("conditioning", "none") != "none":
        facts.append(results["conditioning"])
    sizes = sorted(set(results.get("items", {}).values()))
    if sizes:
        facts.append(f"n = {sizes[0]}" + (f"-{sizes[-1]}" if len(sizes) > 1 else "") + " per task")
    return f"{name} ({', '.join(facts)})" if facts else name


def task_title(results: dict, task: str) -> str:
    """``CLUTRR``, or ``CLUTRR-style (bundled)`` when a local lm-eval task ran in the paper task's slot."""
    lm_eval = results.get("lm_eval_tasks", {}).get(task) or []
    if len(lm_eval) == 1 and lm_eval[0].startswith("looplm_") and lm_eval[0].endswith("_local") and task != "facts":
        items = lm_eval[0][len("looplm_"):-len("_local")]
        name = f"{BUNDLED_NAMES.get(items, items)} (bundled)"
        return name if items == task else f"{name[:-1]}, in the {TASK_NAMES.get(task, task)} slot)"
    return TASK_NAMES.get(task, task)


def _series_style(index: int) -> dict:
    return dict(marker=MARKERS[index % len(MARKERS)], linestyle=LINESTYLES[index % len(LINESTYLES)],
                color=f"C{index % 10}", markersize=5, capsize=2, linewidth=1.4, elinewidth=0.9)


def _offset(index: int, count: int) -> float:
    return (index - (count - 1) / 2) * DODGE if count > 1 else 0.0


def _nan(value) -> float:
    return math.nan if value is None else value


def _series(ax, index: int, count: int, xs, ys, errs, label: str, **style):
    """One line with error bars (NaN bars are not drawn), nudged by its series index; colour,
    marker and line style follow the index, so a model keeps them across panels."""
    dx = _offset(index, count)
    return ax.errorbar([x + dx for x in xs], ys, yerr=[_nan(e) for e in errs], label=label,
                       **{**_series_style(index), **style})


def _training_marks(ax, models: list[tuple[int, dict]], depths_of=lambda res: res["effective_depth"].values()) -> None:
    """The training depth L(K) and the extrapolation region beyond it, as legend entries.

    ``models`` are (series index, results) pairs. One shared L(K): one dashed line and the region
    L(r) > L(K) shaded. Different L(K): a dashed line in each model's colour and, for each model
    that was run past its L(K), a strip of shading in its colour along the bottom of the axes
    (a shared shading would call a model's r <= K points extrapolation)."""
    xs = [x for _, res in models for x in depths_of(res)]
    left, right = min(xs), max(xs)
    train_depths = sorted({res["training_depth"] for _, res in models})
    if len(train_depths) == 1:
        depth = train_depths[0]
        ax.axvline(depth, color="0.3", linestyle="--", linewidth=1, label=f"training depth L(K) = {depth}")
        if right > depth:
            ax.axvspan(depth, right + 0.5, color="gold", alpha=0.15, lw=0, label=EXTRAPOLATION)
    else:
        strip = 0.03
        for row, (index, res) in enumerate(models):
            color, depth = f"C{index % 10}", res["training_depth"]
            ax.axvline(depth, color=color, linestyle="--", linewidth=1, label=f"L(K) = {depth}: {model_label(res)}")
            top = max(depths_of(res))
            if top > depth:
                ax.axvspan(depth, top + 0.5, ymin=row * strip, ymax=(row + 1) * strip, color=color, alpha=0.45, lw=0,
                           label=f"extrapolation (r > K): {model_label(res)}")
    ax.set_xlim(left - 0.5, right + 0.5)


def _chance_lines(ax, values: list[float]) -> str:
    """A dotted line at each distinct chance level (mean over items of 1 / number of choices), one
    legend entry for all of them; returns their values as text for the title (a label written on
    the line would sit on the markers)."""
    levels = sorted({round(v, 6) for v in values})
    for i, value in enumerate(levels):
        ax.axhline(value, color="0.45", linestyle=":", linewidth=1.2, label=CHANCE if i == 0 else None)
    return ", ".join(f"{v:.1f}%" for v in levels)


def groups_figure(results_list: list[dict]):
    """Fig. 2 style: a panel per group some model was evaluated on (Overall, Knowledge, Reasoning)
    vs effective depth; a group no task measured gets no (empty) panel."""
    panels = [(key, title) for key, title in PANELS
              if any(v is not None for res in results_list for v in res["groups"].get(key, {}).values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 3.9), squeeze=False)
    axes = list(axes.flat)
    count = len(results_list)
    for ax, (key, title) in zip(axes, panels):
        drawn = [(i, res) for i, res in enumerate(results_list)
                 if any(v is not None for v in res["groups"].get(key, {}).values())]
        for index, res in drawn:
            rs = sorted(r for r, v in res["groups"][key].items() if v is not None)
            errs = res.get("groups_stderr", {}).get(key, {})
            _series(ax, index, count, [res["effective_depth"][r] for r in rs], [res["groups"][key][r] for r in rs],
                    [errs.get(r) for r in rs], model_label(res))
        chance = _chance_lines(ax, [res["groups_chance"][key] for _, res in drawn
                                    if res.get("groups_chance", {}).get(key) is not None])
        _training_marks(ax, list(enumerate(results_list)))
        ax.set_title(f"{title} (chance {chance})" if chance else title)
        ax.set_xlabel(DEPTH_AXIS)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ACCURACY_AXIS)
    _legend_right(axes[-1], fig, every_axis=True)
    return fig


def per_depth_figure(results: dict, task: str):
    """Fig. 1 b,c style: one line per depth stratum, accuracy vs effective depth."""
    by_r = results["per_depth"][task]
    axis = results.get("depth_axes", {}).get(task, "depth")
    trained = set(results.get("trained_depths", {}).get(task, []))
    strata = sorted({d for cells in by_r.values() for d in cells})
    fig, ax = plt.subplots(figsize=(7.5, 4))
    chance = []
    for index, depth in enumerate(strata):
        rs = sorted(r for r, cells in by_r.items() if depth in cells)
        cells = [by_r[r][depth] for r in rs]
        suffix = "" if not trained else (" (trained)" if depth in trained else " (not in training)")
        _series(ax, index, len(strata), [results["effective_depth"][r] for r in rs], [c["accuracy"] for c in cells],
                [c.get("stderr") for c in cells], f"{axis} {depth}{suffix}",
                **({} if not trained else {"linestyle": "-" if depth in trained else "--"}))
        chance += [c["chance"] for c in cells if c.get("chance") is not None]
    chance_text = _chance_lines(ax, chance)
    _training_marks(ax, [(0, results)])
    ax.set_title(f"{task_title(results, task)}: accuracy by {axis}\n{model_label(results)}"
                 + (f", chance {chance_text}" if chance_text else ""), fontsize=10)
    ax.set_xlabel(DEPTH_AXIS)
    ax.set_ylabel(ACCURACY_AXIS)
    ax.grid(alpha=0.3)
    _legend_right(ax, fig)
    return fig


def loss_figure(results_list: list[dict], log_y: bool = True):
    """Held-out loss vs effective depth L(r), one line per model, in two panels: (a) every r, log y
    by default (an under-unrolled r = 1 can sit an order of magnitude above the rest) with a dotted
    line at ln|V|, the loss of a uniform prediction over the vocabulary; (b) the same lines on a
    linear y cut to the band the r >= K points span, where models differ by hundredths of a nat."""
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(12, 4.2))
    drawn = [(i, res) for i, res in enumerate(results_list) if res.get("heldout")]
    for ax in (full, zoom):
        for index, res in drawn:
            rs = sorted(res["heldout"])
            _series(ax, index, len(results_list), [res["effective_depth"][r] for r in rs],
                    [res["heldout"][r]["loss"] for r in rs], [res["heldout"][r].get("stderr") for r in rs],
                    model_label(res))
        _training_marks(ax, drawn, depths_of=lambda res: [res["effective_depth"][r] for r in res["heldout"]])
        ax.set_xlabel(DEPTH_AXIS)
        ax.grid(alpha=0.3)
    # |V| the tokenizer's (the tokens a prediction is over), not the model's vocab_size, padded above it
    for vocab in sorted({v for _, res in drawn if (v := res.get("tokenizer_vocab_size") or res.get("vocab_size"))}):
        full.axhline(math.log(vocab), color="0.45", linestyle=":", linewidth=1.2,
                     label=f"uniform prediction: ln|V| = ln {vocab:,} = {math.log(vocab):.2f}")
    full.set_title("(a) every r" + (", log scale" if log_y else ""), fontsize=10)
    with_errors = any(cell.get("stderr") is not None for _, res in drawn for cell in res["heldout"].values())
    full.set_ylabel(LOSS_AXIS if with_errors else LOSS_AXIS.split(",")[0])
    if log_y:
        plotting.log_y(full)
    losses = [(res["effective_depth"][r] >= res["training_depth"], cell["loss"], cell.get("stderr") or 0.0)
              for _, res in drawn for r, cell in res["heldout"].items()]
    top = max(loss + err for past, loss, err in losses if past) if any(p for p, _, _ in losses) else \
        max(loss + err for _, loss, err in losses)
    bottom = min(loss - err for _, loss, err in losses)
    pad = 0.08 * (top - bottom or top * 0.01)
    zoom.set_ylim(bottom - pad, top + pad)
    above = sum(loss > top + pad for _, loss, _ in losses)
    zoom.set_title("(b) zoom on r ≥ K, linear y" + (f" ({above} point{'s' * (above > 1)} above: see (a))"
                                                    if above else ""), fontsize=10)
    fig.suptitle("Held-out loss against effective depth", fontsize=11)
    _legend_right(zoom, fig, every_axis=True)
    return fig


def plot_groups(results_list: list[dict], path: str | Path) -> Path:
    return _save(groups_figure(results_list), path)


def plot_per_depth(results: dict, task: str, path: str | Path) -> Path:
    return _save(per_depth_figure(results, task), path)


def plot_loss(results_list: list[dict], path: str | Path, log_y: bool = True) -> Path:
    return _save(loss_figure(results_list, log_y), path)


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


def _legend_right(ax, fig, every_axis: bool = False) -> None:
    """The legend outside the axes; integer ticks on the x axes, which are effective depths."""
    for each in fig.axes:
        each.xaxis.set_major_locator(MaxNLocator(integer=True))
    plotting.legend_outside(ax, fig, every_axis)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # a kill mid-write leaves the previous figure, never a partial PNG
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
