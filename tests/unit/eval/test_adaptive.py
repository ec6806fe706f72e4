"""``eval/adaptive.py``: the adaptive-exit sweep's bookkeeping and outputs, without a model: loops per
token counted from the exports' ``exit_loops`` (padding left out), the thresholds and criteria it
accepts, the CSV and Markdown table it writes, and the frontier figure's points. (The sweep on an
export: tests/integration/eval/test_adaptive_sweep.py.)"""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch

from megatron_loop.errors import LoopConfigError
from megatron_loop.eval.adaptive import (LoopCounter, _frontier_panels, check_adaptive, count_loops,
                                         format_adaptive_table, parse_thresholds, threshold_key,
                                         write_adaptive_outputs)


def test_loop_counter_leaves_padding_out():
    counter = LoopCounter()
    assert counter.mean is None
    counter.add(torch.tensor([[1, 2, 3], [4, 4, 4]]))  # no mask: every token
    assert (counter.loops, counter.tokens) == (18, 6)
    # left padding (the mask may be longer than the positions run: its last columns are used)
    counter.add(torch.tensor([[9, 2, 2], [3, 3, 3]]), attention_mask=torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))
    assert (counter.loops, counter.tokens) == (18 + 4 + 9, 6 + 5)
    assert counter.mean == pytest.approx(31 / 11)


def test_count_loops_hooks_every_forward_and_removes_its_hook():
    class Export(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return SimpleNamespace(exit_loops=torch.full(input_ids.shape, 2))

    model = Export()
    with count_loops(model) as counted:
        model(torch.zeros(2, 3))
        model(torch.zeros(1, 4), attention_mask=torch.tensor([[0, 1, 1, 1]]))
    assert (counted.loops, counted.tokens) == (2 * 6 + 2 * 3, 9)
    assert not model._forward_hooks
    model(torch.zeros(2, 3))
    assert counted.tokens == 9  # no longer counting


def test_thresholds_and_criteria():
    assert parse_thresholds("0,1e-4, 0.5") == [0.0, 1e-4, 0.5]
    for bad in ("", "a,1", "-1", "nan"):
        with pytest.raises(LoopConfigError, match=r"--exit-thresholds .*: expected comma-separated numbers >= 0"):
            parse_thresholds(bad)
    assert [threshold_key(t) for t in (0.0, 1e-4, 0.5)] == ["0", "0.0001", "0.5"]
    session = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(model_type="looplm")))
    check_adaptive(session, "kl", 8)
    with pytest.raises(LoopConfigError,
                       match=r"--exit-criterion 'entropy': expected one of \('kl', 'cosine', 'q_exit'\)"):
        check_adaptive(session, "entropy", 8)
    # Ouro's Q-exit: probabilities, and an export with the learned exit gate
    assert parse_thresholds("0.5,1", "q_exit") == [0.5, 1.0]
    with pytest.raises(LoopConfigError, match=r"--exit-thresholds '0.5,2' with --exit-criterion q_exit: expected "
                                              r"probabilities q in \[0, 1\]"):
        parse_thresholds("0.5,2", "q_exit")
    with pytest.raises(LoopConfigError, match="--exit-criterion q_exit: the export has no learned exit gate"):
        check_adaptive(session, "q_exit", 8)
    gated = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(model_type="looplm", exit_gate="learned")))
    check_adaptive(gated, "q_exit", 8)
    with pytest.raises(LoopConfigError, match="--exit-max-loops 0: expected an integer >= 1"):
        check_adaptive(session, "cosine", 0)
    native = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(model_type="llama")))
    with pytest.raises(LoopConfigError, match="a native llama export is NonLoop"):
        check_adaptive(native, "kl", 8)


def _results():
    def row(threshold, loops, overall, loss):
        return {"threshold": threshold, "loops_per_token": loops, "effective_depth": 2 + 2 * loops,
                "tasks": {"piqa": overall}, "groups": {"overall": overall}, "tasks_stderr": {},
                "groups_stderr": {"overall": 1.5}, "heldout": {"loss": loss}}

    return {"label": "2x4", "loops": [2, 4], "effective_depth": {2: 6, 4: 10}, "training_depth": 10,
            "tasks": {"piqa": {2: 50.0, 4: 55.0}}, "groups": {"overall": {2: 50.0, 4: 55.0}},
            "heldout": {2: {"loss": 3.5}, 4: {"loss": 3.0}},
            "adaptive": {"criterion": "kl", "max_loops": 4, "thresholds": [0.0, 0.01],
                         "by_threshold": {"0": row(0.0, 4.0, 55.0, 3.0), "0.01": row(0.01, 2.5, 53.0, 3.25)}}}


def test_outputs_list_each_threshold_then_the_fixed_r_rows(tmp_path):
    results = _results()
    csv_path, figure = write_adaptive_outputs(results, tmp_path / "out")
    rows = list(csv.reader(csv_path.open()))
    assert rows == [
        ["mode", "threshold", "loops_per_token", "effective_depth", "overall", "heldout_loss", "piqa"],
        ["kl (r <= 4)", "0.0", "4.0000", "10.0000", "55.0000", "3.0000", "55.0000"],
        ["kl (r <= 4)", "0.01", "2.5000", "7.0000", "53.0000", "3.2500", "53.0000"],
        ["fixed", "", "2", "6", "50.0000", "3.5000", "50.0000"],
        ["fixed", "", "4", "10", "55.0000", "3.0000", "55.0000"]]
    assert figure == tmp_path / "out" / "frontier.png" and figure.stat().st_size > 0
    table = format_adaptive_table(results)
    assert "kl threshold (r <= 4)" in table.splitlines()[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert [[float(c[0]), float(c[1]), float(c[2]), c[3], float(c[4])] for c in cells] == [
        [0.0, 4.0, 10.0, "55.00 ± 1.50", 3.0], [0.01, 2.5, 7.0, "53.00 ± 1.50", 3.25]]


def test_frontier_puts_fixed_and_adaptive_points_on_effective_depth():
    panels = _frontier_panels(_results())
    assert panels == [("Overall accuracy (%)", [(6, 50.0), (10, 55.0)], [(10.0, 55.0), (7.0, 53.0)]),
                      ("held-out loss", [(6, 3.5), (10, 3.0)], [(10.0, 3.0), (7.0, 3.25)])]
