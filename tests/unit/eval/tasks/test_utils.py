"""``eval/tasks/utils.py``: the shipped lm-eval tasks' document processing on rows shaped like the datasets'
(tasksource/proofwriter, CLUTRR/v1, SaylorTwift/bbh), built with ``datasets`` itself. The file is loaded by
path, as lm-eval loads it (``eval/tasks/`` is a folder of task files, not a package); the refusals of a
split without ProofWriter's configuration and of an unknown CLUTRR label are in tests/unit/eval/test_tasks.py."""

from __future__ import annotations

import importlib.util

from datasets import Dataset

from megatron_loop.eval.tasks import TASKS_DIR

_spec = importlib.util.spec_from_file_location("looplm_task_utils", TASKS_DIR / "utils.py")
utils = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(utils)
CLUTRR_RELATIONS, PROOFWRITER_CHOICES = utils.CLUTRR_RELATIONS, utils.PROOFWRITER_CHOICES


def test_proofwriter_keeps_its_configuration_and_reads_the_depth():
    rows = Dataset.from_dict({"theory": ["Bob is big. ", "x"], "question": [" Bob is big.", "y"],
                              "answer": ["true", "False"], "QDep": [2, 0], "config": ["depth-5", "depth-3"]})
    out = utils.process_proofwriter(rows)
    assert len(out) == 1
    doc = out[0]
    assert doc["query"] == "Bob is big.\nQuestion: Bob is big. True, False, or Unknown?\nAnswer:"
    assert (doc["choices"], doc["gold"], doc["depth"]) == (PROOFWRITER_CHOICES, 0, 2)



def test_clutrr_chain_length_from_the_task_name_else_the_relations():
    assert utils.clutrr_chain_length({"task_name": "task_1.4", "f_comb": "a-b"}) == 4
    assert utils.clutrr_chain_length({"task_name": "other", "f_comb": "son-aunt-wife"}) == 3
    assert utils.clutrr_chain_length({"f_comb": "son"}) == 1


def test_clutrr_rows_become_21_way_choices():
    assert len(CLUTRR_RELATIONS) == 21 and "brother-in-law" not in CLUTRR_RELATIONS
    rows = Dataset.from_dict({"story": ["[Ann] met [Bo]."], "query": ["('Ann', 'Bo')"], "target_text": ["niece"],
                              "f_comb": ["x-y"], "task_name": ["task_1.2"]})
    doc = utils.process_clutrr(rows)[0]
    assert doc["query"] == "Ann met Bo.\nQuestion: How is Bo related to Ann?\nAnswer: Bo is Ann's"
    assert (doc["gold"], doc["depth"]) == (CLUTRR_RELATIONS.index("niece"), 2)



def test_bbh_choices_by_the_form_of_the_target():
    rows = Dataset.from_dict({"input": ["Pick.\n(A) x\n(C) z\n(B) y", "Is it? ", "T or F", "Argument", "2+2"],
                              "target": ["(B)", "No", "True", "invalid", "4"]})
    docs = list(utils.process_bbh(rows))
    assert [d["choices"] for d in docs] == [["(A)", "(B)", "(C)"], ["Yes", "No"], ["True", "False"],
                                            ["valid", "invalid"], ["4"]]
    assert [d["gold"] for d in docs] == [1, 1, 0, 1, 0]
    assert docs[1]["query"] == "Q: Is it?\nA:"
