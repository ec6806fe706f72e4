"""The evaluation suite's table and arithmetic (paper App. C.3), without running a model."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest

from data_fixtures import REPO

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.eval import harness
from megatron_loop.eval import tasks as tasks_module
from megatron_loop.eval.tasks import BBH_SUBTASKS, PAPER_TASKS, TASKS_DIR, aggregate, resolve_tasks

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)

# Table 6, in the paper's order.
TABLE_6 = ["disambiguation_qa", "salient_translation_error_detection", "reasoning_about_colored_objects",
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
    assert list(BBH_SUBTASKS) == TABLE_6
    assert PAPER_TASKS["bbh"].lm_eval_tasks == tuple(f"looplm_bbh_{s}" for s in TABLE_6)
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
    sqrt(sum se_i^2) / 14, and beside it lm-eval's size-weighted group number (its own
    aggregate_subtask_metrics, weight_by_size as in lm-eval's bbh group); per-depth accuracy,
    standard error and chance from the logged samples."""
    import lm_eval
    from lm_eval.api.metrics import aggregate_subtask_metrics

    sub_acc = {f"looplm_bbh_{s}": (i + 1) / 20 for i, s in enumerate(BBH_SUBTASKS)}
    sizes = {k: 3 + 5 * i for i, k in enumerate(sub_acc)}  # subtasks of unequal size, as in BBH
    samples = [{"doc": {"depth": d}, "acc": float(ok), "arguments": [0] * 3} for d, ok in
               [(0, 1), (0, 1), (0, 0), (1, 0), (1, 0), (2, 1)]]
    fake = {"results": {**{k: {"acc,none": v, "acc_stderr,none": v / 10} for k, v in sub_acc.items()},
                        "looplm_proofwriter": {"acc,none": 0.5, "acc_stderr,none": "N/A"}},
            "samples": {"looplm_proofwriter": samples, **{k: [{"doc": {}, "acc": 1.0, "arguments": [0, 0]}] * sizes[k]
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
    bbh = out.subtask_averages["bbh"]
    assert set(out.subtask_averages) == {"bbh"} and bbh["mean"] == out.scores["bbh"]
    acc, n = [100 * v for v in sub_acc.values()], list(sizes.values())
    assert bbh["size_weighted"] == pytest.approx(aggregate_subtask_metrics(acc, n, weight_by_size=True))
    assert bbh["mean"] == pytest.approx(aggregate_subtask_metrics(acc, n, weight_by_size=False))
    assert bbh["size_weighted"] > bbh["mean"] + 5  # the larger subtasks score higher here
    assert bbh["subtasks"]["looplm_bbh_snarks"] == {"accuracy": pytest.approx(50.0), "n": sizes["looplm_bbh_snarks"]}


def _shipped_utils():
    spec = importlib.util.spec_from_file_location("looplm_task_utils", TASKS_DIR / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The label map of CLUTRR/v1's dataset card and loading script ("target" index -> "target_text").
CLUTRR_V1_LABELS = {"aunt": 0, "son-in-law": 1, "grandfather": 2, "brother": 3, "sister": 4, "father": 5,
                    "mother": 6, "grandmother": 7, "uncle": 8, "daughter-in-law": 9, "grandson": 10,
                    "granddaughter": 11, "father-in-law": 12, "mother-in-law": 13, "nephew": 14, "son": 15,
                    "daughter": 16, "niece": 17, "husband": 18, "wife": 19, "sister-in-law": 20}


def test_clutrr_choices_are_the_v1_relation_labels():
    """Every CLUTRR item is scored over CLUTRR/v1's 21 labels (no "brother-in-law"), gold = the
    row's ``target`` index; a target outside them fails loudly."""
    from datasets import Dataset

    utils = _shipped_utils()
    rows = [  # two test rows of CLUTRR/v1 gen_train234_test2to10 (fields the task reads)
        {"story": "[Clarence]'s granddaughter, [Emily], was busy helping her brother, [Michael], move to college.",
         "query": "('Clarence', 'Michael')", "target": 10, "target_text": "grandson",
         "f_comb": "granddaughter-brother", "task_name": "task_1.2"},
        {"story": "[Ashley] and her grandson [Dennis] went to the store to buy a birthday present for "
                  "[Dennis]'s sister [Jennifer].", "query": "('Ashley', 'Jennifer')", "target": 11,
         "target_text": "granddaughter", "f_comb": "grandson-sister", "task_name": "task_1.2"},
    ]
    docs = list(utils.process_clutrr(Dataset.from_list(rows)))
    for row, doc in zip(rows, docs):
        assert doc["choices"] == sorted(CLUTRR_V1_LABELS, key=CLUTRR_V1_LABELS.get)
        assert doc["gold"] == row["target"] and doc["depth"] == 2
        assert doc["query"].endswith(f"{row['query'].split(chr(39))[3]} is {row['query'].split(chr(39))[1]}'s")
    with pytest.raises(LoopDataError, match="'brother-in-law' is not one of CLUTRR/v1's 21 relation labels"):
        utils.process_clutrr(Dataset.from_list([{**rows[0], "target_text": "brother-in-law"}]))


def test_proofwriter_depth_filter_fails_loudly():
    """The depth-5 configuration is kept; a split without it (or without a config column) is an
    error naming what it has, never every row silently."""
    from datasets import Dataset

    utils = _shipped_utils()
    row = {"theory": "Bob is big. If someone is big then they are red.", "question": "Bob is red.",
           "answer": "True", "QDep": 1}
    mixed = Dataset.from_list([{**row, "config": "depth-5"}, {**row, "QDep": 0, "config": "depth-3"}])
    assert [d["depth"] for d in utils.process_proofwriter(mixed)] == [1]
    with pytest.raises(LoopDataError, match=re.escape("no rows of configuration 'depth-5' in the split "
                                                      "(its 'config' column has ['depth-2', 'depth-3'])")):
        utils.process_proofwriter(Dataset.from_list([{**row, "config": "depth-3"}, {**row, "config": "depth-2"}]))
    with pytest.raises(LoopDataError, match="column has None"):
        utils.process_proofwriter(Dataset.from_list([row]))


def test_bundled_tasks_fill_knowledge_and_reasoning():
    """The tasks every sweep on the bundled corpus runs (tools/pipeline.sh, used by make demo and
    the toy study): facts in the Knowledge group, the reasoning generators in three reasoning slots;
    Knowledge = facts, Reasoning = mean of three, Overall = mean of all four."""
    pipeline = (REPO / "tools" / "pipeline.sh").read_text()
    local = re.search(r'^LOCAL_TASKS="([^"]+)"', pipeline, re.MULTILINE).group(1)
    specs = resolve_tasks(local.split(","))
    assert {s.key: (s.group, s.lm_eval_tasks) for s in specs} == {
        "facts": ("knowledge", ("looplm_facts_local",)),
        "clutrr": ("reasoning", ("looplm_clutrr_local",)),
        "proofwriter": ("reasoning", ("looplm_proofwriter_local",)),
        "bbh": ("reasoning", ("looplm_tracking_local",))}
    groups = aggregate({"facts": 70.0, "clutrr": 30.0, "proofwriter": 50.0, "bbh": 40.0}, specs)
    assert groups == {"knowledge": 70.0, "reasoning": 40.0, "overall": 47.5}
    # with the paper's knowledge tasks, facts is one more Knowledge member
    specs = resolve_tasks(["sciq", "facts", "clutrr"])
    assert aggregate({"sciq": 60.0, "facts": 80.0, "clutrr": 30.0}, specs) == {
        "knowledge": 70.0, "reasoning": 30.0, "overall": pytest.approx(170 / 3)}


def test_shipped_task_yamls_register():
    manager = harness.task_manager()
    shipped = {t for s in PAPER_TASKS.values() for t in s.lm_eval_tasks if t.startswith("looplm_")}
    assert len(shipped) == 16
    assert shipped <= set(manager.all_tasks)
    stock = {t for s in PAPER_TASKS.values() for t in s.lm_eval_tasks} - shipped
    assert stock <= set(manager.all_tasks)  # the stock lm-eval tasks exist under these names
