"""The evaluation suite's table and arithmetic (paper App. A.3), without running a model."""

from __future__ import annotations

import math

import pytest

from data_fixtures import REPO

from megatron_loop.errors import LoopConfigError
from megatron_loop.eval import harness
from megatron_loop.eval import tasks as tasks_module
from megatron_loop.eval.tasks import BBH_SUBTASKS, PAPER_TASKS, aggregate, resolve_tasks

# Table 10, in the paper's order.
TABLE_10 = ["disambiguation_qa", "salient_translation_error_detection", "reasoning_about_colored_objects",
            "causal_judgement", "date_understanding", "hyperbaton", "logical_deduction_three_objects",
            "logical_deduction_seven_objects", "penguins_in_a_table", "snarks", "temporal_sequences",
            "tracking_shuffled_objects_three_objects", "tracking_shuffled_objects_five_objects",
            "tracking_shuffled_objects_seven_objects"]


def test_groups_and_metrics_follow_the_paper():
    specs = resolve_tasks(None)
    assert [s.key for s in specs if s.group == "knowledge"] == ["sciq", "arc_easy", "piqa"]
    assert [s.key for s in specs if s.group == "reasoning"] == [
        "arc_challenge", "winogrande", "openbookqa", "hellaswag", "commonsense_qa", "proofwriter", "clutrr", "bbh"]
    fixed_form = {s.key for s in specs if s.metric == "acc"}
    assert fixed_form == {"winogrande", "commonsense_qa", "proofwriter", "bbh"}
    assert list(BBH_SUBTASKS) == TABLE_10
    assert PAPER_TASKS["bbh"].lm_eval_tasks == tuple(f"looplm_bbh_{s}" for s in TABLE_10)
    in_code = {s.lm_eval_tasks[0].split("_bbh_")[0] + ("_bbh" if s.key == "bbh" else ""): s.metric for s in specs}
    assert documented_metrics(tasks_module.__doc__) == in_code
    docs = (REPO / "docs" / "EVALUATION.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in docs.splitlines()
            if line.startswith("| ") and ("acc |" in line or "acc_norm |" in line)]
    assert {r[1].split("_&lt;")[0]: r[2] for r in rows} == in_code
    assert {r[1].split("_&lt;")[0]: r[4].lower() for r in rows} == {k: g for k, g in zip(
        in_code, [s.group for s in specs])}


def documented_metrics(text: str) -> dict[str, str]:
    """{lm-eval task (BBH: looplm_bbh): metric} from the rows of the documented task table."""
    table = {}
    for line in text.splitlines():
        words = line.split()
        metric = next((w for w in words if w in ("acc", "acc_norm")), None)
        if metric and len(words) > 2:
            table[words[1].replace("_<subtask>", "")] = metric
    return table


def test_overall_reproduces_the_paper_number():
    """4x5 BaseLoop, Table 11: Knowledge 62.80, Reasoning 28.52 -> Overall 37.87."""
    specs = resolve_tasks(None)
    knowledge = {"sciq": 80.1, "arc_easy": 55.3, "piqa": 53.0}  # mean 62.80
    reasoning = dict(zip([s.key for s in specs if s.group == "reasoning"],
                         [25.0, 50.6, 20.0, 30.16, 19.4, 40.0, 20.0, 23.0]))  # mean 28.52
    groups = aggregate({**knowledge, **reasoning}, specs)
    assert groups["knowledge"] == pytest.approx(62.80)
    assert groups["reasoning"] == pytest.approx(28.52)
    assert round(groups["overall"], 2) == 37.87
    # Overall is the mean over the eleven tasks, not the mean of the two group scores
    assert groups["overall"] == pytest.approx((3 * 62.80 + 8 * 28.52) / 11)
    assert not math.isclose(groups["overall"], (62.80 + 28.52) / 2)


def test_groups_over_present_tasks_and_extras_excluded():
    specs = resolve_tasks(["clutrr=looplm_clutrr_local", "sciq", "looplm_tracking_local:acc_norm"])
    assert specs[0].lm_eval_tasks == ("looplm_clutrr_local",) and specs[0].metric == "acc_norm"
    assert specs[2].group == "extra" and specs[2].metric == "acc_norm"
    groups = aggregate({"clutrr": 30.0, "sciq": 60.0, "looplm_tracking_local": 99.0}, specs)
    assert groups == {"knowledge": 60.0, "reasoning": 30.0, "overall": 45.0}
    assert aggregate({"clutrr": 30.0}, resolve_tasks(["clutrr"]))["knowledge"] is None


@pytest.mark.parametrize("bad", [["nosuch=x"], ["clutrr="], ["x:f1"], ["sciq", "sciq"]])
def test_bad_task_arguments_name_the_problem(bad):
    with pytest.raises(LoopConfigError, match="--tasks"):
        resolve_tasks(bad)


def test_bbh_is_the_mean_of_its_subtasks_and_depths_are_stratified(monkeypatch):
    """evaluate_tasks: BBH = unweighted mean of the 14 subtask accuracies, its standard error
    sqrt(sum se_i^2) / 14; per-depth accuracy, standard error and chance from the logged samples."""
    import lm_eval

    sub_acc = {f"looplm_bbh_{s}": (i + 1) / 20 for i, s in enumerate(BBH_SUBTASKS)}
    samples = [{"doc": {"depth": d}, "acc": float(ok), "arguments": [0] * 3} for d, ok in
               [(0, 1), (0, 1), (0, 0), (1, 0), (1, 0), (2, 1)]]
    fake = {"results": {**{k: {"acc,none": v, "acc_stderr,none": v / 10} for k, v in sub_acc.items()},
                        "looplm_proofwriter": {"acc,none": 0.5, "acc_stderr,none": "N/A"}},
            "samples": {"looplm_proofwriter": samples, **{k: [{"doc": {}, "acc": 1.0, "arguments": [0, 0]}]
                                                          for k in sub_acc}}}
    seen = {}

    def simple_evaluate(**kwargs):
        seen.update(kwargs)
        return fake

    monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
    specs = resolve_tasks(["bbh", "proofwriter"])
    tasks = {name: f"task object {name}" for name in [*sub_acc, "looplm_proofwriter"]}  # built by load_tasks
    out = harness.evaluate_tasks("LM", specs, "manager", limit=5, tasks=tasks)
    assert out.scores["bbh"] == pytest.approx(100 * sum(sub_acc.values()) / 14)
    assert out.stderr["bbh"] == pytest.approx(100 * math.sqrt(sum((v / 10) ** 2 for v in sub_acc.values())) / 14)
    assert out.scores["proofwriter"] == 50.0 and out.stderr["proofwriter"] is None  # lm-eval: one item, "N/A"
    assert out.chance == {"bbh": pytest.approx(50.0), "proofwriter": pytest.approx(100 / 3)}
    se = lambda p, n: 100 * math.sqrt(p * (1 - p) / (n - 1))  # noqa: E731  lm-eval's mean_stderr of 0/1 items
    assert out.per_depth == {"proofwriter": {
        0: {"accuracy": pytest.approx(200 / 3), "stderr": pytest.approx(se(2 / 3, 3)), "chance": pytest.approx(100 / 3),
            "n": 3},
        1: {"accuracy": 0.0, "stderr": 0.0, "chance": pytest.approx(100 / 3), "n": 2},
        2: {"accuracy": 100.0, "stderr": None, "chance": pytest.approx(100 / 3), "n": 1}}}
    assert seen["tasks"] == [tasks[n] for n in sorted(tasks)] and seen["log_samples"] and seen["limit"] == 5
    assert "num_fewshot" not in seen  # zero-shot is set on the task objects once, by load_tasks


def test_shipped_task_yamls_register():
    manager = harness.task_manager()
    shipped = {t for s in PAPER_TASKS.values() for t in s.lm_eval_tasks if t.startswith("looplm_")}
    assert len(shipped) == 16
    assert shipped <= set(manager.all_tasks)
    stock = {t for s in PAPER_TASKS.values() for t in s.lm_eval_tasks} - shipped
    assert stock <= set(manager.all_tasks)  # the stock lm-eval tasks exist under these names
