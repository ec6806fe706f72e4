"""Compute against accuracy under per-token adaptive exit (``tools/eval_loops.py --exit-criterion``).

For each exit threshold the exported model runs with ``exit_criterion`` and ``num_loops`` = the
cap R (``modeling_looplm.TokenExit``): the same lm-eval suite and held-out loss as the fixed-r
sweep (``sweep.py``), plus the mean number of loops each token ran and the effective depth that
mean implies, L = p + mean_loops * s + c. The frontier figure puts the adaptive points and the
fixed-r curve (loops per token = r, L(r)) on the same axes: a threshold is worth it when its
point lies above the fixed-r curve at equal depth.

Loops per token are counted by a forward hook on every token the model processes: on the
held-out windows that is every token exactly; in lm-eval passes it includes the right padding
of batched requests (lm-eval sorts requests by length, so padding is a small share; use
``--batch-size 1`` for an exact count). ``loops_per_token`` is the held-out figure when held-out
loss is evaluated, else the lm-eval one. The KL criterion also costs one LM-head readout per loop
and token, which the effective depth does not count (docs/BENCHMARKS.md has decode timings).

``results["adaptive"]``::

    {"criterion", "exit_mode", "max_loops", "thresholds": [t...],
     "by_threshold": {"<t>": {"threshold", "loops_per_token", "effective_depth",
                              "heldout_loops_per_token", "task_loops_per_token",
                              "tasks": {task: percent}, "groups": {group: percent},
                              "tasks_stderr": {task: percent}, "groups_stderr": {group: percent},
                              "heldout": {"loss", "perplexity", "sequences"}}},
     "exit_distribution": {"loops", "mean_pdf", "expected_loop", "mean_entropy", "tokens"}}  # q_exit only

With ``q_exit`` (Ouro's Q-exit on a learned exit gate) and a held-out prefix, ``exit_distribution`` is
the gate's learned depth distribution p(t|x) at r = cap, averaged over the held-out tokens.

``exit_mode`` is how an exit acted (``--exit-mode``; default the export's, which for ``q_exit`` is Ouro's
``readout``): under ``freeze`` ``loops_per_token`` is the loops each token ran; under ``readout`` every token
runs the cap and ``loops_per_token`` is the mean loop whose state was read out (Ouro's exit step), the depth the
prediction comes from, not the compute spent. Exports written before the mode existed freeze.
"""

from __future__ import annotations

import csv
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from megatron_loop.atomic import atomic_path  # noqa: E402
from megatron_loop.errors import LoopConfigError  # noqa: E402
from megatron_loop.eval import heldout  # noqa: E402 (module-qualified, as in sweep)
from megatron_loop.eval.harness import evaluate_tasks  # noqa: E402
from megatron_loop.eval.report import format_cell  # noqa: E402
from megatron_loop.eval.sweep import SweepSession, SweepSettings, architecture  # noqa: E402
from megatron_loop.eval.tasks import aggregate, aggregate_stderr  # noqa: E402

EXIT_CRITERIA = ("kl", "cosine", "q_exit")  # q_exit: Ouro's Q-exit, thresholds q in [0, 1], a learned exit gate


class LoopCounter:
    """Sum of loops and number of tokens over the forwards seen while counting."""

    def __init__(self) -> None:
        self.loops = 0
        self.tokens = 0

    def add(self, exit_loops, attention_mask=None) -> None:
        if attention_mask is not None and attention_mask.dim() == 2:
            keep = attention_mask[:, -exit_loops.shape[1]:].bool()
            self.loops += int(exit_loops[keep].sum())
            self.tokens += int(keep.sum())
        else:
            self.loops += int(exit_loops.sum())
            self.tokens += exit_loops.numel()

    @property
    def mean(self) -> float | None:
        return self.loops / self.tokens if self.tokens else None


@contextmanager
def count_loops(model):
    """Count the loops per token of every forward of ``model`` (a LoopLM HF export) in the block."""
    counter = LoopCounter()

    def hook(module, args, kwargs, output):
        if getattr(output, "exit_loops", None) is not None:
            counter.add(output.exit_loops, kwargs.get("attention_mask"))

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()


def parse_thresholds(text: str, criterion: str = "kl") -> list[float]:
    """Distances (kl, cosine): numbers >= 0; Ouro's Q-exit: cumulative exit probabilities q in [0, 1]."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(not v >= 0 for v in values):
        raise LoopConfigError(f"--exit-thresholds {text!r}: expected comma-separated numbers >= 0, e.g. 1e-4,1e-3")
    if criterion == "q_exit" and any(v > 1 for v in values):
        raise LoopConfigError(f"--exit-thresholds {text!r} with --exit-criterion q_exit: expected probabilities q in "
                              "[0, 1] (exit once the cumulative exit probability reaches q), e.g. 0.5,0.7,0.9")
    return values


def threshold_key(threshold: float) -> str:
    return f"{threshold:g}"


def check_adaptive(session: SweepSession, criterion: str, max_loops: int) -> None:
    """Refuse an adaptive sweep that cannot run, before any evaluation."""
    if criterion not in EXIT_CRITERIA:
        raise LoopConfigError(f"--exit-criterion {criterion!r}: expected one of {EXIT_CRITERIA} (or none)")
    if max_loops < 1:
        raise LoopConfigError(f"--exit-max-loops {max_loops}: expected an integer >= 1")
    if session.model.config.model_type != "looplm":
        raise LoopConfigError(f"--exit-criterion {criterion}: a native {session.model.config.model_type} export is "
                              "NonLoop (one loop); adaptive exit needs a LoopLM export")
    if criterion == "q_exit" and getattr(session.model.config, "exit_gate", "none") != "learned":
        raise LoopConfigError("--exit-criterion q_exit: the export has no learned exit gate (model.exit_gate: "
                              "learned, Ouro); use kl or cosine")


def exit_mode_in_effect(model, criterion: str) -> str:
    """How the export's exit acts (``modeling_looplm.exit_mode_of``; ``freeze`` for an export written before the
    mode existed, whose modeling file knows no other)."""
    import sys

    exit_mode_of = getattr(sys.modules[type(model).__module__], "exit_mode_of", None)
    return "freeze" if exit_mode_of is None else exit_mode_of(criterion, getattr(model.config, "exit_mode", None))


def run_adaptive_sweep(session: SweepSession, settings: SweepSettings, criterion: str, thresholds: list[float],
                       max_loops: int, exit_mode: str | None = None) -> dict:
    """Scores, held-out loss and loops per token of the export at each threshold (cap ``max_loops``),
    on the model, tasks and lm-eval wrapper the fixed-r sweep loaded (``session``)."""
    from tqdm.auto import tqdm

    check_adaptive(session, criterion, max_loops)
    model, manager, tasks, lm = session.model, session.manager, session.tasks, session.lm
    arch = architecture(model.config)
    p, s, c = arch["prelude_layers"], arch["core_layers"], arch["coda_layers"]
    saved_mode = getattr(model.config, "exit_mode", None)
    if exit_mode is not None:
        model.config.exit_mode = exit_mode
    out = {"criterion": criterion, "exit_mode": exit_mode_in_effect(model, criterion), "max_loops": max_loops,
           "thresholds": list(thresholds), "by_threshold": {}}
    model.config.num_loops, model.config.exit_criterion = max_loops, criterion
    try:
        for threshold in tqdm(thresholds, desc=f"adaptive exit ({criterion})", unit="threshold",
                              disable=not settings.progress):
            model.config.exit_threshold = threshold
            row: dict = {"threshold": threshold, "tasks": {}, "groups": {}, "tasks_stderr": {}, "groups_stderr": {},
                         "heldout": None}
            if settings.tasks:
                with count_loops(model) as counted:
                    scores = evaluate_tasks(lm, settings.tasks, manager, settings.limit, tasks)
                row["tasks"], row["groups"] = scores.scores, aggregate(scores.scores, settings.tasks)
                row["tasks_stderr"] = scores.stderr
                row["groups_stderr"] = aggregate_stderr(scores.stderr, settings.tasks)
                row["task_loops_per_token"] = counted.mean
            if settings.valid_prefix:
                with count_loops(model) as counted:
                    row["heldout"] = heldout.heldout_loss(model, settings.valid_prefix, settings.seq_length,
                                                  settings.valid_sequences, batch_size=settings.batch_size)
                row["heldout_loops_per_token"] = counted.mean
            loops = row.get("heldout_loops_per_token", row.get("task_loops_per_token"))
            row["loops_per_token"] = loops
            row["effective_depth"] = None if loops is None else p + loops * s + c
            out["by_threshold"][threshold_key(threshold)] = row
        if criterion == "q_exit" and settings.valid_prefix:
            out["exit_distribution"] = learned_depth(model, settings, max_loops)
    finally:
        model.config.num_loops, model.config.exit_criterion, model.config.exit_threshold = None, "none", 0.0
        if exit_mode is not None:
            model.config.exit_mode = saved_mode
    return out


def learned_depth(model, settings: SweepSettings, loops: int) -> dict:
    """Ouro's learned depth distribution on the held-out windows: p(t|x) of the exit gate at r = ``loops``
    (no exit: the fixed model's trajectory) averaged over every predicted token, its mean exit loop
    sum_t t p(t) and the mean per-token entropy H(p) in nats (``results["adaptive"]["exit_distribution"]``)."""
    import torch

    total, entropy, tokens = None, 0.0, 0

    def hook(module, args, kwargs, output):
        nonlocal total, entropy, tokens
        pdf = output.exit_pdf.double().reshape(-1, output.exit_pdf.shape[-1])
        total = pdf.sum(0) if total is None else total + pdf.sum(0)
        entropy += float(-(pdf * pdf.clamp(min=1e-300).log()).sum())
        tokens += pdf.shape[0]

    model.config.num_loops, model.config.exit_criterion = loops, "none"
    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        heldout.heldout_loss(model, settings.valid_prefix, settings.seq_length, settings.valid_sequences,
                             batch_size=settings.batch_size)
    finally:
        handle.remove()
    mean = (total / tokens).tolist()
    return {"loops": loops, "mean_pdf": mean, "expected_loop": sum((t + 1) * p for t, p in enumerate(mean)),
            "mean_entropy": entropy / tokens, "tokens": tokens}


def write_adaptive_outputs(results: dict, output: str | Path, others: list[dict] | None = None) -> list[Path]:
    """``adaptive.csv`` (one row per threshold, then the fixed-r rows) and ``frontier.png`` (with the
    frontiers of ``others``, results of other models that have an ``adaptive`` section)."""
    adaptive = results["adaptive"]
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "adaptive.csv"
    tasks = list(results.get("tasks", {}))
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "threshold", "loops_per_token", "effective_depth", "overall", "heldout_loss", *tasks])
        for row in adaptive["by_threshold"].values():
            w.writerow([f"{adaptive['criterion']} (r <= {adaptive['max_loops']})", row["threshold"],
                        _fmt(row["loops_per_token"]), _fmt(row["effective_depth"]), _fmt(row["groups"].get("overall")),
                        _fmt((row["heldout"] or {}).get("loss")), *(_fmt(row["tasks"].get(t)) for t in tasks)])
        for r in results["loops"]:
            w.writerow(["fixed", "", r, results["effective_depth"][r], _fmt(results["groups"]["overall"].get(r)),
                        _fmt(results.get("heldout", {}).get(r, {}).get("loss")),
                        *(_fmt(results["tasks"][t].get(r)) for t in tasks)])
    everyone = [results, *(o for o in others or [] if o.get("adaptive"))]
    return [csv_path, plot_frontier(everyone, out / "frontier.png")]


def format_adaptive_table(results: dict) -> str:
    """The threshold table printed after the fixed-r table: Markdown (pytablewriter, as
    ``report.format_table``), one row per threshold with loops per token, effective depth,
    overall score ± standard error and held-out loss."""
    from pytablewriter import MarkdownTableWriter

    adaptive = results["adaptive"]
    writer = MarkdownTableWriter()
    writer.headers = [f"{adaptive['criterion']} threshold (r <= {adaptive['max_loops']})", "Loops/token",
                      "Eff. depth", "Overall", "Held-out loss"]
    writer.value_matrix = [
        [row["threshold"], _fmt(row["loops_per_token"]), _fmt(row["effective_depth"]),
         format_cell(row["groups"].get("overall"), row["groups_stderr"].get("overall")),
         _fmt((row["heldout"] or {}).get("loss"))]
        for row in adaptive["by_threshold"].values()]
    writer.margin = 1
    return writer.dumps()


def _frontier_panels(results: dict) -> list[tuple[str, list, list]]:
    """(y label, fixed-r points, adaptive points), points (depth, y), for overall score and held-out loss."""
    rows = results["adaptive"]["by_threshold"].values()
    depth = results["effective_depth"]
    panels = []
    fixed = [(depth[r], v) for r, v in results["groups"]["overall"].items() if v is not None]
    adaptive = [(row["effective_depth"], row["groups"]["overall"]) for row in rows
                if row["groups"].get("overall") is not None]
    if fixed or adaptive:
        panels.append(("Overall accuracy (%)", fixed, adaptive))
    fixed = [(depth[r], v["loss"]) for r, v in results.get("heldout", {}).items()]
    adaptive = [(row["effective_depth"], row["heldout"]["loss"]) for row in rows if row["heldout"]]
    if fixed or adaptive:
        panels.append(("held-out loss", fixed, adaptive))
    return panels


def plot_frontier(results_list: list[dict], path: str | Path) -> Path:
    """Score (and held-out loss) against mean effective depth: each model's fixed-r curve (solid)
    and adaptive-exit points (dashed, one per threshold) on one set of axes per metric."""
    by_metric: dict[str, list] = {}
    for results in results_list:
        for ylabel, fixed, points in _frontier_panels(results):
            by_metric.setdefault(ylabel, []).append((results, fixed, points))
    fig, axes = plt.subplots(1, max(len(by_metric), 1), figsize=(5.5 * max(len(by_metric), 1), 3.8), squeeze=False)
    for ax, (ylabel, curves) in zip(axes[0], by_metric.items()):
        for i, (results, fixed, points) in enumerate(curves):
            label, color = results.get("label") or results.get("layout"), f"C{i}"
            if fixed:
                xs, ys = zip(*sorted(fixed))
                ax.plot(xs, ys, marker="o", color=color, label=f"{label}: fixed r")
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="s", linestyle="--", color=color, label=(
                    f"{label}: {results['adaptive']['criterion']} exit, r <= {results['adaptive']['max_loops']}"))
            ax.axvline(results["training_depth"], color="0.3", linestyle=":", linewidth=1)
        ax.set_xlabel("mean effective depth p + (loops per token) s + c")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
