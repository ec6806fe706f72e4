"""``curves.py``'s loop-dynamics figure (``tools/plot_metrics.py`` writes it beside the curves):
read from the ``dynamics`` records of metrics.jsonl, one line per loop l (or r), labelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_loop.curves import plot_dynamics, plot_runs, read_run
from testpaths import load_script


def _write(run: Path, dynamics: bool, gates: bool = True) -> None:
    run.mkdir(parents=True)
    lines = [{"event": "train", "step": i, "tokens": 64 * i, "loss": 5.0 - i / 10, "lr_muon": 1e-3,
              "lr_adamw": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e3, "mfu": 0.01} for i in range(1, 5)]
    if dynamics:
        for step in (2, 4):
            record = {"event": "dynamics", "step": step, "batch_loss_r1": 5.0 / step, "batch_loss_r2": 4.0 / step,
                      "batch_loss_r3": 4.5 / step, "state_norm_l0": 1.0, "state_norm_l1": 1.1, "state_norm_l2": 1.2,
                      "state_norm_l3": 1.25, "relative_update_l1": 0.5 / step, "relative_update_l2": 0.1 / step,
                      "relative_update_l3": 0.02 / step}
            if gates:
                record.update({"loop_gate_l1": 1.0 + step / 10, "loop_gate_l2": 1.0 - step / 10})
            lines.append(record)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_dynamics_figure_has_a_line_per_loop_with_the_recorded_values(tmp_path, capsys):
    _write(tmp_path / "a", dynamics=True)
    fig = plot_dynamics([read_run(tmp_path / "a")])
    update_ax, norm_ax, loss_ax, gate_ax = fig.axes[:4]
    updates = {line.get_label(): line for line in update_ax.get_lines()}
    assert set(updates) == {"relative update l = 1", "relative update l = 2", "relative update l = 3"}
    assert list(updates["relative update l = 2"].get_xdata()) == [2, 4]
    assert list(updates["relative update l = 2"].get_ydata()) == pytest.approx([0.05, 0.025])
    assert update_ax.get_yscale() == "log"
    assert [line.get_label() for line in norm_ax.get_lines()] == [f"state norm l = {l}" for l in range(4)]
    assert [line.get_label() for line in loss_ax.get_lines()] == ["r = 1", "r = 2", "r = 3"]
    assert list(gate_ax.get_lines()[1].get_ydata()) == pytest.approx([0.8, 0.6])  # loop gate l = 2
    assert "nats" in loss_ax.get_ylabel() and "g_l" in gate_ax.get_ylabel()

    _write(tmp_path / "plain", dynamics=False)
    assert plot_dynamics([read_run(tmp_path / "plain")]) is None  # nothing recorded, no figure

    tool = load_script("tools/plot_metrics.py")
    assert tool.main([str(tmp_path / "a"), str(tmp_path / "plain"), "--output", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c_dynamics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "loop dynamics of a" in capsys.readouterr().out
    assert tool.main([str(tmp_path / "plain"), "--output", str(tmp_path / "d.png")]) == 0
    assert not (tmp_path / "d_dynamics.png").exists()


def test_a_run_without_gates_has_no_gate_panel_and_the_step_axis_spans_its_training(tmp_path):
    _write(tmp_path / "a", dynamics=True, gates=False)
    fig = plot_dynamics([read_run(tmp_path / "a")])
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == [
        "Relative update per loop l", "State norm per loop l (l = 0: Prelude output)",
        "Held-out batch loss at r = K - 1, K, K + 1"]  # no empty panel
    assert all(ax.get_xlim()[0] == 0 and ax.get_xlim()[1] >= 4 for ax in fig.axes)  # steps 0-4, not 1.9-4.1
    for ax in fig.axes:  # each legend to the right of its panel, clear of the lines
        assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


def test_curves_without_mfu_have_no_mfu_panel(tmp_path):
    run = tmp_path / "cpu"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"event": "train", "step": i, "loss": 5.0 - i / 10,
                                                           "lr_muon": 1e-3, "lr_adamw": 1e-3, "grad_norm": 1.0,
                                                           "tokens_per_s": 1e3, "mfu": None}) + "\n"
                                               for i in range(1, 5)))
    fig = plot_runs([read_run(run)])
    assert [ax.get_title() for ax in fig.axes] == ["Loss (log scale)", "Learning rate", "Gradient norm (log scale)",
                                                   "Throughput", ""]  # the last: the legend's panel
    assert fig.axes[-1].get_legend() is not None and not fig.axes[-1].axison


def test_curves_go_to_png_pdf_or_svg_and_the_shared_learning_rate_is_labelled(tmp_path):
    from megatron_loop.errors import LoopConfigError
    from megatron_loop.curves import plot_runs, save_figure

    _write(tmp_path / "a", dynamics=False)
    fig = plot_runs([read_run(tmp_path / "a")])
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["a: learning rate (Muon = AdamW)"]
    assert save_figure(fig, tmp_path / "c.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in save_figure(fig, tmp_path / "c.svg").read_bytes()[:400]
    with pytest.raises(LoopConfigError, match=r"expected a \.png, \.pdf or \.svg file"):
        save_figure(fig, tmp_path / "c.jpg")
    assert not (tmp_path / "c.jpg").exists()


def test_plot_metrics_names_what_it_skips_and_refuses_what_it_cannot_draw(tmp_path, capsys):
    """Garbage lines, records without a step and values that are not (non-negative) numbers are left
    out with one warning line each, naming the file and line numbers; a panel left empty is said; a
    file with no finite loss, or a PNG given as RUN, is one error line and exit 2, nothing written."""
    import math

    tool = load_script("tools/plot_metrics.py")
    run = tmp_path / "a"
    _write(run, dynamics=False)  # lines 1-4: steps 1-4
    with (run / "metrics.jsonl").open("a") as f:
        f.write("not json\n")  # 5
        f.write(json.dumps({"event": "train", "step": "six", "loss": 1.0}) + "\n")  # 6
        f.write(json.dumps({"event": "train", "step": 7, "loss": "low", "grad_norm": -1.0, "mfu": math.nan}) + "\n")
        f.write("\n" + json.dumps({"event": "eval", "step": 7, "val_loss_r2": [1]}) + "\n")  # 8 blank, 9
    assert tool.main([str(run), "--output", str(tmp_path / "a.png")]) == 0
    file = run / "metrics.jsonl"
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {file}: line 5: not a JSON record; skipped",
        f"warning: {file}: line 6: no step (expected an integer >= 0); skipped",
        f"warning: {file}: line 7: loss is not a non-negative number ('low'); not drawn",
        f"warning: {file}: line 7: grad_norm is not a non-negative number (-1.0); not drawn",
        f"warning: {file}: line 9: val_loss_r2 is not a non-negative number ([1]); not drawn"]
    fig = plot_runs([read_run(run)])
    assert list(fig.axes[0].get_lines()[0].get_ydata())[:4] == pytest.approx([4.9, 4.8, 4.7, 4.6])

    nan = tmp_path / "nan"
    nan.mkdir()
    (nan / "metrics.jsonl").write_text("".join(json.dumps({"event": "train", "step": s, "loss": math.nan,
                                                           "grad_norm": math.nan}) + "\n" for s in (1, 2)))
    assert tool.main([str(nan), "--output", str(tmp_path / "n.png")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {nan / 'metrics.jsonl'}: no training step with a finite loss (2 'train' records); nothing to draw")
    with (nan / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"event": "train", "step": 3, "loss": 2.0, "grad_norm": math.inf}) + "\n")
    assert tool.main([str(nan), "--output", str(tmp_path / "n.png")]) == 0
    assert capsys.readouterr().err == (f"warning: {nan / 'metrics.jsonl'}: grad_norm is NaN or infinite in all 3 "
                                       "'train' records; its panel is empty\n")

    png = tmp_path / "a.png"
    assert tool.main([str(png), "--output", str(tmp_path / "p.png")]) == 2
    assert capsys.readouterr().err == (f"error: {png}: a PNG image; expected a metrics.jsonl written by "
                                       "pretrain_loop.py (or its run folder)\n")
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "n_dynamics.png").exists()
