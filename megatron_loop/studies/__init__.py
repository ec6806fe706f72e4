"""Registered studies of the paper's three findings at CPU scale (docs/STUDIES.md, docs/REPRODUCE.md).

The harness sits above ``registry`` (the CPU twins and their configs) and ``eval`` (per-item scoring):

* :mod:`.plan`: :class:`~.plan.StudyPlan` -- models and seeds, corpus and training, the primary test and its
  decision rule, the power analysis, the secondary readings; its text is what is registered.
* :mod:`.plans`: the three plans (findings 1-3); :mod:`.registration`: the sha256 of each registered plan,
  committed before any confirmatory run.
* :mod:`.provenance`: the gate before a confirmatory run (registered plan, clean checkout, the commit recorded).
* :mod:`.stats`: t intervals over seeds, the power analysis; :mod:`.baselines`: the compose items' trivial
  baselines; :mod:`.analysis`: the plan applied to per-item results; :mod:`.archive`: the per-item archive
  (``docs/studies/STUDY.json.gz``); :mod:`.report` and :mod:`.docs`: the tables REPRODUCE.md shows, generated
  from the archives; :mod:`.pilots`: pilot summaries.

Entry points: ``tools/study.py`` and ``bash tools/small_study.sh STUDY``. ``registry`` never imports this package.
"""

from __future__ import annotations

from megatron_loop.errors import LoopConfigError
from megatron_loop.studies.plan import StudyPlan
from megatron_loop.studies.plans import PLANS
from megatron_loop.studies.registration import REGISTERED


def plan_of(name: str) -> StudyPlan:
    if name not in PLANS:
        raise LoopConfigError(f"study {name!r}: not a registered study; expected one of {', '.join(PLANS)}")
    return PLANS[name]


def report_of(plan: StudyPlan, document: dict) -> str:
    from megatron_loop.studies.report import markdown

    return markdown(plan, document)


def registry_study(plan: StudyPlan):
    """The plan as a registry :class:`~megatron_loop.registry.Study` (tools/generate_configs.py writes its CPU
    twins' configs from it, tools/small_study.sh runs them); ``seeds`` is the union of the models' seeds, the
    runs themselves are :func:`run_copies`."""
    from megatron_loop.registry import Study

    seeds = tuple(sorted({s for arm in plan.arms for s in arm.seeds}))
    return Study(plan.name, "", plan.title, tuple(arm.name for arm in plan.arms),
                 toy_runs=tuple(arm.toy for arm in plan.arms), seeds=seeds, toy_train=plan.train,
                 corpus_args=plan.corpus_args, eval_tasks=",".join(plan.tasks),
                 note="a registered study (megatron_loop/studies/): tools/study.py gate, the runs, tools/study.py finish")


def run_copies(plan: StudyPlan) -> list[tuple]:
    """(CPU twin, run name NAME-seedS, seed) of every run of the plan, seed by seed (an interrupted study has
    whole seeds, the contrasts' pairs first), each model only at its own seeds."""
    return [(arm.toy, f"{arm.name}-seed{seed}", seed)
            for seed in sorted({s for arm in plan.arms for s in arm.seeds}) for arm in plan.arms if seed in arm.seeds]


__all__ = ["PLANS", "REGISTERED", "StudyPlan", "plan_of", "registry_study", "report_of", "run_copies"]
