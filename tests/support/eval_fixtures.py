"""Small local task files in the hub schemas of the shipped tasks (tasksource/proofwriter,
CLUTRR/v1, SaylorTwift/bbh), and lm-eval YAMLs that ``include`` the shipped task YAMLs and
only swap the dataset for these files (``dataset_path: json``), so the tests run the shipped
document processing and metrics offline."""

from __future__ import annotations

import json
import random
from pathlib import Path

from megatron_loop.eval.tasks import TASKS_DIR

PROOFWRITER_DEPTHS = (0, 1, 2, 3)
CLUTRR_LENGTHS = (2, 3, 4)
PER_DEPTH = 3


def proofwriter_rows() -> list[dict]:
    rng = random.Random(0)
    rows = []
    for depth in PROOFWRITER_DEPTHS:
        for i in range(PER_DEPTH):
            answer = ["True", "False", "Unknown"][(depth + i) % 3]
            rows.append({"id": f"pw-{depth}-{i}", "theory": f"The cat is big. If something is big then it is red. "
                                                            f"The dog is {rng.choice(['kind', 'cold'])}.",
                         "question": "The cat is red.", "answer": answer, "QDep": depth, "config": "depth-5"})
    # another ProofWriter configuration: dropped by the task (it keeps depth-5 only)
    rows.append({"id": "pw-other", "theory": "Bob is nice.", "question": "Bob is nice.", "answer": "True",
                 "QDep": 0, "config": "depth-3"})
    return rows


def clutrr_rows() -> list[dict]:
    relations = ["father", "sister", "son", "aunt", "grandmother", "nephew"]
    rows = []
    for length in CLUTRR_LENGTHS:
        for i in range(PER_DEPTH):
            comb = "-".join(relations[(i + j) % len(relations)] for j in range(length))
            rows.append({"id": f"cl-{length}-{i}", "story": "[Ann] went shopping with her father [Bob]. "
                                                             "[Bob] called his sister [Cid].",
                         "query": "('Ann', 'Cid')", "target_text": ["aunt", "niece", "grandson"][i % 3],
                         # the first item of each length has no task_name: the length comes from f_comb
                         "f_comb": comb, "task_name": "" if i == 0 else f"task_1.{length}"})
    return rows


def bbh_rows() -> list[dict]:
    return [
        {"input": "Which statement is sarcastic?\nOptions:\n(A) Great, more rain.\n(B) Rain helps plants.",
         "target": "(A)"},
        {"input": "Which sentence has the correct adjective order:\nOptions:\n(A) big old red car\n"
                  "(B) red old big car", "target": "(A)"},
        {"input": "Did the man cause the window to break on purpose?", "target": "No"},
        {"input": "The pen is on the desk. Where is the pen?\nOptions:\n(A) floor\n(B) desk\n(C) bag",
         "target": "(B)"},
    ]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_local_tasks(folder: Path) -> dict[str, str]:
    """Write the files and YAMLs into ``folder``; returns {paper task key: local lm-eval task}."""
    folder.mkdir(parents=True, exist_ok=True)
    shipped = {"proofwriter": ("looplm_proofwriter.yaml", proofwriter_rows()),
               "clutrr": ("looplm_clutrr.yaml", clutrr_rows()),
               "bbh": ("looplm_bbh_snarks.yaml", bbh_rows())}
    tasks = {}
    for key, (yaml_name, rows) in shipped.items():
        data = _write(folder / f"{key}.jsonl", rows)
        task = f"looplm_{key}_test"
        (folder / f"{task}.yaml").write_text(
            f"include: {json.dumps(str(TASKS_DIR / yaml_name))}\n"
            f"task: {task}\n"
            "dataset_path: json\n"
            "dataset_name: null\n"
            "dataset_kwargs:\n"
            "  data_files:\n"
            f"    test: {json.dumps(str(data))}\n")
        tasks[key] = task
    return tasks
