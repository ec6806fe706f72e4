"""``plotting.py``: the shared figure helpers, read back from the matplotlib objects they set (the figures
themselves: tests/integration/figures/test_figures.py)."""

from __future__ import annotations

import matplotlib

from megatron_loop import plotting


def test_agg_backend():
    assert matplotlib.get_backend().lower() == "agg"


def _axes():
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    return plt, fig, a, b


def test_log_y_labels_plain_numbers_inside_the_range():
    plt, fig, ax, _ = _axes()
    ax.plot([1, 2], [0.9, 60])
    ax.set_ylim(0.9, 60)
    plotting.log_y(ax)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert ax.get_yscale() == "log" and ax.get_ylim() == (0.9, 60)
    # 1-1.2-1.5-2-3-4-5-7 x 10^k inside 0.9..60 are 15 values; at most 7 ticks: every ceil(15 / 7) = 3rd
    assert labels == ["1", "2", "5", "12", "30"]
    assert ax.yaxis.get_minor_locator().__class__.__name__ == "NullLocator"
    plt.close(fig)


def test_log_y_on_a_narrow_range_spreads_ticks_evenly():
    plt, fig, ax, _ = _axes()
    ax.set_ylim(1.04, 1.14)
    plotting.log_y(ax, count=5)
    ticks = list(ax.get_yticks())
    assert len(ticks) >= 4 and ticks == sorted(set(ticks)) and 1.04 <= ticks[0] and ticks[-1] <= 1.14
    assert len({t.get_text() for t in ax.get_yticklabels()}) == len(ticks)  # digits enough to tell them apart
    plt.close(fig)


def test_one_legend_outside_with_each_label_once():
    plt, fig, a, b = _axes()
    a.plot([0, 1], label="run A")
    b.plot([0, 1], label="run A")
    b.plot([1, 0], label="run B")
    plotting.legend_outside(a, fig, every_axis=True, extra={"shaded: one std": a.lines[0]})
    legend = a.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["run A", "run B", "shaded: one std"]
    assert b.get_legend() is None
    plt.close(fig)


def test_run_name_is_the_run_folder():
    assert plotting.run_name("runs/tiny_2x3/hf") == "tiny_2x3"
