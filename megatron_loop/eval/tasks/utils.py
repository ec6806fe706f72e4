"""Document processing for the shipped lm-eval tasks (ProofWriter, CLUTRR, BBH as multiple choice).

Each ``process_*`` adds ``query`` (prompt), ``choices``, ``gold`` (index) and, for the
depth-controlled tasks, ``depth``: ProofWriter's proof depth (``QDep``) and CLUTRR's
relation-chain length (from ``task_name``). ``depth`` is what
``megatron_loop.eval`` stratifies logged samples by (paper Fig. 1 b,c).
"""

from __future__ import annotations

import ast
import re

from megatron_loop.errors import LoopDataError

PROOFWRITER_CHOICES = ["True", "False", "Unknown"]
# tasksource/proofwriter stacks every configuration of the original release in one split; its
# ``config`` column names it. The paper's proof depths 0-5 are the ``depth-5`` configuration.
PROOFWRITER_CONFIG = "depth-5"
# CLUTRR/v1's relation labels, in the order of its ``target`` index (dataset card and loading
# script of CLUTRR/v1: "aunt": 0, "son-in-law": 1, ..., "sister-in-law": 20). There are 21:
# the dataset has no "brother-in-law".
CLUTRR_RELATIONS = [
    "aunt", "son-in-law", "grandfather", "brother", "sister", "father", "mother", "grandmother",
    "uncle", "daughter-in-law", "grandson", "granddaughter", "father-in-law", "mother-in-law",
    "nephew", "son", "daughter", "niece", "husband", "wife", "sister-in-law",
]
_OPTION = re.compile(r"^\(([A-R])\)", re.MULTILINE)


def process_proofwriter(dataset, config: str = PROOFWRITER_CONFIG):
    """tasksource/proofwriter rows (theory, question, answer, QDep, config), keeping the rows of
    configuration ``config`` (``depth-5``: proof depths 0-5). A split without that
    configuration is an error naming the configurations it has, never silently every row."""
    found = sorted(set(dataset["config"])) if "config" in dataset.column_names else None
    if not found or config not in found:
        raise LoopDataError(f"ProofWriter: no rows of configuration {config!r} in the split (its 'config' "
                            f"column has {found}); expected tasksource/proofwriter, whose split holds "
                            f"{config!r} (utils.PROOFWRITER_CONFIG)")
    dataset = dataset.filter(lambda d: d["config"] == config)

    def one(doc):
        answer = str(doc["answer"]).strip().capitalize()
        return {"query": f"{doc['theory'].strip()}\nQuestion: {doc['question'].strip()} True, False, or Unknown?\n"
                         "Answer:",
                "choices": PROOFWRITER_CHOICES, "gold": PROOFWRITER_CHOICES.index(answer),
                "depth": int(doc["QDep"])}

    return dataset.map(one)


def clutrr_chain_length(doc) -> int:
    """Length of the relation chain: ``task_name`` "task_<noise>.<length>" (the dataset card:
    "the second number directly indicates the length of clauses"), else the number of
    relations in ``f_comb`` ("r1-r2-...")."""
    name = str(doc.get("task_name") or "")
    if re.fullmatch(r"task_\d+\.\d+", name):
        return int(name.rsplit(".", 1)[1])
    return len(str(doc["f_comb"]).split("-"))


def process_clutrr(dataset):
    """CLUTRR/v1 rows (story, query "('A', 'B')", target_text, f_comb, task_name); the choices
    are the dataset's 21 relation labels, the same for every row."""

    def one(doc):
        head, tail = ast.literal_eval(doc["query"]) if isinstance(doc["query"], str) else doc["query"]
        story = re.sub(r"[\[\]]", "", doc["story"]).strip()
        if doc["target_text"] not in CLUTRR_RELATIONS:
            raise LoopDataError(f"CLUTRR: target {doc['target_text']!r} is not one of CLUTRR/v1's 21 relation "
                                f"labels {CLUTRR_RELATIONS}")
        return {"query": f"{story}\nQuestion: How is {tail} related to {head}?\nAnswer: {tail} is {head}'s",
                "choices": CLUTRR_RELATIONS, "gold": CLUTRR_RELATIONS.index(doc["target_text"]),
                "depth": clutrr_chain_length(doc)}

    return dataset.map(one)


def process_bbh(dataset):
    """BBH (SaylorTwift/bbh: input, target) as multiple choice over its fixed-form options:
    the lettered options "(A)".."(R)" listed in the input, else Yes/No, True/False or valid/invalid."""

    def one(doc):
        target = doc["target"].strip()
        letters = sorted(set(_OPTION.findall(doc["input"])))
        if letters and re.fullmatch(r"\([A-R]\)", target):
            choices = [f"({x})" for x in letters]
        elif target in ("Yes", "No"):
            choices = ["Yes", "No"]
        elif target in ("True", "False"):
            choices = ["True", "False"]
        else:
            choices = ["valid", "invalid"] if target in ("valid", "invalid") else [target]
        return {"query": f"Q: {doc['input'].strip()}\nA:", "choices": choices, "gold": choices.index(target)}

    return dataset.map(one)
