"""The paper's evaluation suite (App. C.3): task groups, headline metric per task, aggregation.

Every task is zero-shot multiple choice scored by log-likelihood in lm-evaluation-harness.
Headline metric (App. C.3: "length-normalized accuracy for multiple-choice tasks whose options
differ in length, and plain accuracy for tasks with fixed-form options"):

=============== ========================================== ========= =========================
task            lm-eval task(s)                            metric    options
=============== ========================================== ========= =========================
SciQ            sciq                                       acc_norm  free-text answers
ARC-Easy        arc_easy                                   acc_norm  free-text answers
PIQA            piqa                                       acc_norm  free-text solutions
ARC-Challenge   arc_challenge                              acc_norm  free-text answers
WinoGrande      winogrande                                 acc       the two fillers, same continuation
OpenBookQA      openbookqa                                 acc_norm  free-text answers
HellaSwag       hellaswag                                  acc_norm  free-text endings
CommonsenseQA   commonsense_qa                             acc       letters A-E
ProofWriter     looplm_proofwriter (shipped YAML)          acc       True / False / Unknown
CLUTRR          looplm_clutrr (shipped YAML)               acc_norm  kinship words
BBH             looplm_bbh_<subtask> x 14 (shipped YAMLs)  acc       (A), (B), ... / Yes, No
=============== ========================================== ========= =========================

Scores are percentages. BBH's score is read as the unweighted mean of its 14 subtasks (every
subtask counts once, whatever its size): Table 6 lists the subtasks, and the paper does not say
how it averages them (App. C.3 says only that group scores are unweighted averages); lm-eval's
own ``bbh`` group weights subtasks by their item counts instead. The sweep reports both (results
JSON ``subtask_averages``).
Standard errors are lm-eval's per task, combined through every unweighted mean as sqrt(sum se^2) / n.
The bundled corpus adds ``facts`` (``looplm_facts_local``, acc_norm) to the Knowledge group, and
``arith``, ``pointer`` and ``compose`` (digit answers, acc) as reasoning tasks of their own. The paired study
(``eval/paired.py``) scores these items itself, with lm-eval's request construction and these metrics.
Group score = unweighted mean of its tasks; Overall = unweighted mean of all eleven tasks,
Eq. (S_Know, S_Reas): (3 * 62.80 + 8 * 28.52) / 11 = 37.87.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from megatron_loop.errors import LoopConfigError
from megatron_loop.registry.pilot import PILOT_SUITE  # noqa: F401 (the pilot's --tasks, named with the tasks)

TASKS_DIR = Path(__file__).with_name("tasks")

BBH_SUBTASKS = (
    "disambiguation_qa", "salient_translation_error_detection", "reasoning_about_colored_objects",
    "causal_judgement", "date_understanding", "hyperbaton", "logical_deduction_three_objects",
    "logical_deduction_seven_objects", "penguins_in_a_table", "snarks", "temporal_sequences",
    "tracking_shuffled_objects_three_objects", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects",
)

KNOWLEDGE, REASONING, EXTRA = "knowledge", "reasoning", "extra"


@dataclass(frozen=True)
class TaskSpec:
    key: str                       # our name (results, plots)
    lm_eval_tasks: tuple[str, ...]  # the lm-eval task(s); several = unweighted mean (BBH)
    metric: str                    # headline metric: acc or acc_norm
    group: str                     # knowledge | reasoning | extra
    depth_axis: str | None = None  # what the per-doc ``depth`` field means, if stratified


PAPER_TASKS: dict[str, TaskSpec] = {t.key: t for t in (
    TaskSpec("sciq", ("sciq",), "acc_norm", KNOWLEDGE),
    TaskSpec("arc_easy", ("arc_easy",), "acc_norm", KNOWLEDGE),
    TaskSpec("piqa", ("piqa",), "acc_norm", KNOWLEDGE),
    TaskSpec("arc_challenge", ("arc_challenge",), "acc_norm", REASONING),
    TaskSpec("winogrande", ("winogrande",), "acc", REASONING),
    TaskSpec("openbookqa", ("openbookqa",), "acc_norm", REASONING),
    TaskSpec("hellaswag", ("hellaswag",), "acc_norm", REASONING),
    TaskSpec("commonsense_qa", ("commonsense_qa",), "acc", REASONING),
    TaskSpec("proofwriter", ("looplm_proofwriter",), "acc", REASONING, depth_axis="proof depth"),
    TaskSpec("clutrr", ("looplm_clutrr",), "acc_norm", REASONING, depth_axis="relation-chain length"),
    TaskSpec("bbh", tuple(f"looplm_bbh_{s}" for s in BBH_SUBTASKS), "acc", REASONING),
)}
GROUPS = (KNOWLEDGE, REASONING)

# Tasks of the bundled corpus (``tools/make_corpus.py``) that fill no paper slot: recall of the
# generated population's facts, stated only in training biographies (the Knowledge group's
# "facts stored within model weights"). The bundled reasoning tasks run in the ProofWriter,
# CLUTRR and BBH slots instead (``clutrr=looplm_clutrr_local`` ...). Names and free-text
# answers of different lengths -> acc_norm.
BUNDLED_TASKS: dict[str, TaskSpec] = {t.key: t for t in (
    TaskSpec("facts", ("looplm_facts_local",), "acc_norm", KNOWLEDGE),
    # chained arithmetic mod 10 (the knowledge/reasoning study); the ten digits -> acc
    TaskSpec("arith", ("looplm_arith_local",), "acc", REASONING, depth_axis="operations"),
    # in-context pointer chasing (the paired finding-1 study, ``eval/paired.py``); the ten digits -> acc
    TaskSpec("pointer", ("looplm_pointer_local",), "acc", REASONING, depth_axis="hops"),
    # composition of digit permutations (the paired finding-1 study); the ten digits -> acc
    TaskSpec("compose", ("looplm_compose_local",), "acc", REASONING, depth_axis="moves"),
    # the facts' in-context control (the studies of megatron_loop/studies/): the same surface form with the
    # fact stated in the prompt, no stored fact needed; values of different lengths -> acc_norm, in no group
    TaskSpec("openbook", ("looplm_openbook_local",), "acc_norm", EXTRA),
)}


# The optimizer pilot's suite (App. D.1, Table 7) is not App. C.3's: ARC-E, ARC-C, SciQ, MMLU,
# HellaSwag, OBQA, PIQA, RACE, WinoGrande, CSQA, averaged together ("Avg."). MMLU and RACE are
# defined here; the other eight are paper tasks above (ProofWriter, CLUTRR and BBH are not in it).
# MMLU runs as its 57 lm-eval subjects (lm-eval's ``mmlu`` is a group, which the harness scores
# through its subtasks, as BBH): the headline is the unweighted mean over subjects, and results
# JSON ``subtask_averages`` also holds lm-eval's size-weighted ``mmlu`` score; Table 7 does not
# say which it reports. Letters A-D and lm-eval's RACE (acc only) -> acc. They sit in the Knowledge
# and Reasoning groups only so that Overall, the unweighted mean of every grouped task, is
# Table 7's "Avg." of the ten; the pilot reports no group scores.
MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
)
PILOT_TASKS: dict[str, TaskSpec] = {t.key: t for t in (
    TaskSpec("mmlu", tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS), "acc", KNOWLEDGE),
    TaskSpec("race", ("race",), "acc", REASONING),
)}


def resolve_tasks(items: list[str] | None) -> list[TaskSpec]:
    """Task specs from ``--tasks`` items (default: all eleven paper tasks).

    ``KEY`` is a paper task, a bundled one (:data:`BUNDLED_TASKS`) or one of the optimizer pilot's
    (:data:`PILOT_TASKS`); ``KEY=LM_EVAL_TASK`` runs another lm-eval task (e.g. a local
    file-backed one) in that task's slot, keeping its metric and group; any other name runs
    as an extra task (metric ``acc``, in no group); ``NAME:METRIC`` picks the metric of an extra task.
    """
    if not items:
        return list(PAPER_TASKS.values())
    specs: list[TaskSpec] = []
    for item in items:
        if "=" in item:
            key, task = (s.strip() for s in item.split("=", 1))
            if key not in PAPER_TASKS:
                raise LoopConfigError(f"--tasks {item!r}: unknown paper task {key!r}; expected one of "
                                      f"{sorted(PAPER_TASKS)}")
            if not task:
                raise LoopConfigError(f"--tasks {item!r}: expected KEY=LM_EVAL_TASK")
            specs.append(replace(PAPER_TASKS[key], lm_eval_tasks=(task,)))
        elif item in PAPER_TASKS:
            specs.append(PAPER_TASKS[item])
        elif item in BUNDLED_TASKS:
            specs.append(BUNDLED_TASKS[item])
        elif item in PILOT_TASKS:
            specs.append(PILOT_TASKS[item])
        else:
            name, _, metric = item.partition(":")
            metric = metric or "acc"
            if metric not in ("acc", "acc_norm"):
                raise LoopConfigError(f"--tasks {item!r}: metric {metric!r}; expected acc or acc_norm")
            specs.append(TaskSpec(name, (name,), metric, EXTRA, depth_axis="depth"))
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise LoopConfigError(f"--tasks: task listed twice in {keys}")
    return specs


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def stderr_of_mean(errors: list[float | None]) -> float | None:
    """Standard error of an unweighted mean of independent estimates: sqrt(sum se_i^2) / n
    (None when any is unknown). Used for BBH over its subtasks and for the group scores."""
    if not errors or any(e is None for e in errors):
        return None
    return math.sqrt(sum(e * e for e in errors)) / len(errors)


def subtask_averages(accuracy: dict[str, float], size: dict[str, int]) -> dict:
    """The two averages of a task made of subtasks (BBH): ``mean``, the paper's score (each
    subtask once), and ``size_weighted``, lm-eval's group aggregate (``weight_by_size: true``):
    sum(acc_i * n_i) / sum(n_i) over the items each subtask evaluated."""
    return {"mean": mean(list(accuracy.values())),
            "size_weighted": sum(accuracy[k] * size[k] for k in accuracy) / sum(size[k] for k in accuracy),
            "subtasks": {k: {"accuracy": accuracy[k], "n": size[k]} for k in accuracy}}


def aggregate(scores: dict[str, float], specs: list[TaskSpec]) -> dict[str, float | None]:
    """Group scores (unweighted mean of the group's tasks present) and Overall (unweighted mean of
    every grouped task present). ``None`` for a group with no task."""
    out: dict[str, float | None] = {}
    for group in GROUPS:
        members = [scores[s.key] for s in specs if s.group == group and s.key in scores]
        out[group] = mean(members) if members else None
    grouped = [scores[s.key] for s in specs if s.group in GROUPS and s.key in scores]
    out["overall"] = mean(grouped) if grouped else None
    return out


def aggregate_stderr(stderr: dict[str, float | None], specs: list[TaskSpec]) -> dict[str, float | None]:
    """Standard errors of :func:`aggregate`'s group and Overall means (same members, :func:`stderr_of_mean`)."""
    out: dict[str, float | None] = {}
    for group in GROUPS:
        members = [stderr[s.key] for s in specs if s.group == group and s.key in stderr]
        out[group] = stderr_of_mean(members)
    out["overall"] = stderr_of_mean([stderr[s.key] for s in specs if s.group in GROUPS and s.key in stderr])
    return out
