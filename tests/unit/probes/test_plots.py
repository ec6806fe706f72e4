"""Probe figures drawn from geometry.json: the terminal response of
fig:conditioning_responses (a), the configuration ratios R(d), of C/N/B means and per shared-block
pair (fig:conditioning_responses d, fig:appendix_composition_geometry b-d), computed from the
report's N, B, C matrices and plotted with exactly those numbers; ``--replot`` redraws them."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
from probe_fixtures import tiny_model, write_prefix

from megatron_loop.cli import run_cli
from megatron_loop.probes import cli, plots
from megatron_loop.probes.report import probe_geometry
from megatron_loop.probes.runner import ProbeSettings
from megatron_loop.probes.sampling import load_probe_sample

# 1 + 2 x 3 + 1 (K = 3, L(K) = 8); r = 9 gives L(r) = 20, the sources 9-12 and a final loop at 18-19
DEEP = "9"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """(folder, this report, the reference report): two configurations probed on one sample."""
    root = tmp_path_factory.mktemp("probe")
    sample = load_probe_sample(write_prefix(root), 13, 3, 30)
    reference = probe_geometry(tiny_model(prelude=1, coda=1, seed=1), sample,
                               ProbeSettings(loops=[3, 6, 9], progress=False), root / "reference")
    probe_geometry(tiny_model(prelude=1, coda=1), sample, ProbeSettings(loops=[2, 6, 9], progress=False), root / "a",
                   reference=json.loads((root / "reference" / "geometry.json").read_text()))
    return root, json.loads((root / "a" / "geometry.json").read_text()), reference


def _block(position: int) -> int:
    return (position - 2) % 2 + 1  # one prelude block, two shared blocks


def test_terminal_response_by_hand(reports):
    _, report, _ = reports
    result = report["loops"][DEEP]
    C = result["interaction"]["C"]
    tr = result["interaction"]["terminal_response"]
    assert tr["sources"] == [9, 10, 11, 12] and tr["targets"] == list(range(13, 21)) and tr["final_loop"] == [18, 19]
    response = {j: sum(C[i - 1][j - 1] for i in (9, 10, 11, 12)) / 4 for j in range(13, 21)}
    core = (response[18] + response[19]) / 2
    assert tr["relative"] == pytest.approx([response[j] / core for j in range(13, 21)], rel=1e-12)
    assert tr["terminal_to_core"] == pytest.approx(response[20] / core, rel=1e-12)
    assert tr["segments"][-1] == "coda"
    # at r = 6 the final loop (positions 12-13) overlaps the sources: no profile
    assert report["loops"]["6"]["interaction"]["terminal_response"] is None


def test_block_pair_means_and_ratios_by_hand(reports):
    _, report, reference = reports
    assert report["lag_sets"] == ["1-2", "2-2"]
    mine = report["loops"][DEEP]
    theirs = reference["loops"][DEEP]

    def by_hand(result, lags):
        loops = result["loop_of"]
        groups = {}
        for i in range(1, 21):
            for j in range(i + 1, 21):
                if loops[i - 1] and loops[j - 1] and min(loops[i - 1], loops[j - 1]) > 3 and \
                        loops[j - 1] - loops[i - 1] in lags:
                    groups.setdefault(f"{_block(i)}:{_block(j)}", []).append(result["interaction"]["C"][i - 1][j - 1])
        return {k: sum(v) / len(v) for k, v in groups.items()}

    for name, lags in (("1-2", (1, 2)), ("2-2", (2,))):
        pairs = mine["interaction"]["by_lag"]["block_pairs"][name]
        expected = by_hand(mine, lags)
        assert pairs["pairs"] == ["1:1", "1:2", "2:1", "2:2"]
        assert pairs["C"] == pytest.approx([expected[p] for p in pairs["pairs"]], rel=1e-12)
        ratio = report["comparison"][DEEP]["block_pair_ratio"][name]
        reference_means = by_hand(theirs, lags)
        assert ratio["C"] == pytest.approx([expected[p] / reference_means[p] for p in ratio["pairs"]], rel=1e-12)
        summaries = mine["interaction"]["by_lag"]["summaries"][name], theirs["interaction"]["by_lag"]["summaries"][name]
        assert report["comparison"][DEEP]["ratio"][name]["C"] == pytest.approx(summaries[0]["C"] / summaries[1]["C"])


def _lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith(("_", "equal",
                                                                                                        "final",
                                                                                                        "training"))]


def test_figures_plot_the_json_numbers(reports):
    root, report, _ = reports
    assert set(report["files"]) == {plots.TRAJECTORY_PNG, plots.INTERACTION_PNG, plots.TERMINAL_PNG,
                                    plots.COMPARISON_PNG}
    assert all((root / "a" / name).read_bytes()[:4] == b"\x89PNG" for name in report["files"])
    deep = report["loops"][DEEP]

    fig = plots.terminal_response_figure(report)
    (line,) = _lines(fig.axes[0])
    assert list(line.get_xdata()) == deep["interaction"]["terminal_response"]["targets"]
    assert list(line.get_ydata()) == deep["interaction"]["terminal_response"]["relative"]
    assert line.get_label().startswith("r=9, L(r)=20: skips at 9-12, terminal/core = ")
    plt.close(fig)

    fig = plots.comparison_figure(report)
    entry = report["comparison"][DEEP]
    by_label = {ax_index: {line.get_label(): line for line in _lines(ax)} for ax_index, ax in enumerate(fig.axes)}
    assert list(by_label[0]["r=9, L(r)=20"].get_ydata()) == entry["ratio_by_lag"]["C"]["ratio"]
    assert list(by_label[0]["r=9, L(r)=20"].get_xdata()) == entry["ratio_by_lag"]["C"]["lags"]
    assert list(by_label[1]["r=9, L(r)=20, lags 2-2"].get_ydata()) == [entry["ratio"]["2-2"][k] for k in "CNB"]
    pairs = by_label[2]["r=9, L(r)=20, lags 1-2"]
    ticks = [t.get_text() for t in fig.axes[2].get_xticklabels()]
    assert [ticks[round(x)] for x in pairs.get_xdata()] == entry["block_pair_ratio"]["1-2"]["pairs"]
    assert list(pairs.get_ydata()) == entry["block_pair_ratio"]["1-2"]["C"]
    separators = [line for line in fig.axes[2].get_lines() if list(line.get_xdata()) == [1.5, 1.5]]
    assert len(separators) == 1  # between source block 1 (1:1, 1:2) and source block 2 (2:1, 2:2)
    plt.close(fig)

    fig = plots.trajectory_figure(report)
    block = {line.get_label(): line for line in _lines(fig.axes[0])}
    assert list(block["r=9, L(r)=20"].get_ydata()) == deep["block"]["angle"]
    variance = {line.get_label(): line for line in _lines(fig.axes[3])}
    assert list(variance["r=9, L(r)=20"].get_ydata()) == deep["loop"]["normalized_state_variance"]
    assert list(variance["r=9, L(r)=20"].get_xdata()) == pytest.approx([t / 3 for t in range(10)])
    plt.close(fig)


def test_replot_recomputes_summaries_and_redraws_from_the_json(reports, tmp_path, capsys):
    root, report, _ = reports
    args = ["--replot", str(root / "a" / "geometry.json"), "--reference-json", str(root / "reference"),
            "--output", str(tmp_path / "redrawn")]
    assert run_cli(cli.main, args) == 0
    again = json.loads((tmp_path / "redrawn" / "geometry.json").read_text())
    assert again["files"] == report["files"] and again["comparison"] == report["comparison"]
    assert again["loops"][DEEP]["interaction"] == report["loops"][DEEP]["interaction"]
    assert "redrew" in capsys.readouterr().out
    for bad, message in ((["--replot", str(tmp_path / "none.json")],
                          f"error: --replot {tmp_path / 'none.json'}: not found; expected a geometry.json written by "
                          "tools/probe_geometry.py (or its folder)"),
                         (["--replot", str(root / "a" / "geometry.json"), "--reference-json", str(root / "a" / "x")],
                          f"error: --reference-json {root / 'a' / 'x'}: not found; expected a geometry.json written "
                          "by tools/probe_geometry.py (or its folder)")):
        assert run_cli(cli.main, [*bad, "--output", str(tmp_path / "no")]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "no").exists()


def test_sample_defaults_to_the_papers_100000_positions():
    parsed = cli.build_parser().parse_args(["--checkpoint", "c", "--valid-prefix", "v", "--output", "o"])
    # the sample's sizes come from the run and the data when not given (main); at the paper's 49 x 2,048
    assert parsed.num_sequences is None and parsed.seq_length is None
    assert cli.PAPER_NUM_SEQUENCES == 49 and cli.PAPER_SEQ_LENGTH == 2048  # 49 x 2047 >= 100,000 (App. C.4)
    available = cli.PAPER_NUM_SEQUENCES * (cli.PAPER_SEQ_LENGTH - 1)
    assert cli._num_positions(parsed.num_positions, available) == 100_000 == cli.PAPER_NUM_POSITIONS
    assert cli._num_positions("all") is None and cli._num_positions("500", 100) == 500  # checked when sampling


def test_the_default_takes_every_position_of_a_smaller_sample_and_says_so(capsys):
    assert cli._num_positions("paper", 99_999) is None
    assert capsys.readouterr().err.strip() == ("note: --num-positions paper: the sample holds 99,999 positions, "
                                               "fewer than the paper's 100,000 (App. C.4); using all of them")
