"""Every module of ``megatron_loop`` has a unit test file (``tests/unit/<package>/test_<module>.py``;
top-level modules: ``tests/unit/test_<module>.py``; the layout in tests/conftest.py), or is on the list
below with the reason it has none yet. The list may only shrink: a new module without a unit test file
fails here, and so does an entry whose module gained one (or is gone), so the gap stays visible.

At issue 41's start 62 of the 140 modules had no unit test file (and 57 of 119 at the issue's filing).
"""

from __future__ import annotations

from testpaths import REPO

PACKAGE = REPO / "megatron_loop"

WITHOUT_UNIT_TEST = {
    # gpu/: the GPU session's driver (issue 41 item 8a); its CPU smoke runs every step
    "gpu/__main__.py": "the driver's command line: tests/integration/tools/test_gpu_first.py (bash tools/gpu_first.sh)",
    "gpu/env.py": "the kit install, preamble and data build: tests/integration/tools/test_gpu_first.py",
    "gpu/first.py": "the first session's steps: tests/integration/tools/test_gpu_first.py (--smoke on CPU)",
    "gpu/second.py": "the report session's steps: tests/integration/tools/test_gpu_report.py (--smoke on CPU)",
    "gpu/session.py": "a session's output folder, summary and port: tests/integration/tools/test_gpu_first.py",
    "gpu/steps.py": "steps in process groups with timeouts: tests/integration/tools/test_gpu_first.py",
    "gpu/tables.py": "the one renderer of bench.py and the report: tests/integration/tools/test_gpu_report.py and "
                     "tests/integration/tools/test_bench.py",
    "gpu/report_inputs.py": "the report's inputs read back: tests/integration/tools/test_gpu_report.py",
    "gpu/report_sections.py": "the report's sections: tests/integration/tools/test_gpu_report.py",
    # data/
    "data/corpus_knowledge.py": "the generated corpus's fact part: tests/unit/data/test_corpus.py",
    "data/corpus_templates.py": "the generated corpus's templates: tests/unit/data/test_corpus.py and "
                                "tests/unit/studies/test_items.py",
    # eval/
    "eval/sweep_lm.py": "lm-eval's HFLM subclass, needs an export: tests/integration/eval/test_one_pass_sweep.py "
                        "(bitwise against one pass per r)",
    # measure/
    "measure/loss_check.py": "the GPU first-run loss check: tests/integration/tools/test_gpu_first.py",
    # model/
    "model/layers.py": "megatron-core block specs: tests/unit/model/test_fast_path.py and the TP runs",
    # optim/
    "optim/engine.py": "build_engine's signature is being changed by issue 41 item 5 (one resolved DeepSpeed "
                       "settings object): tests/integration/training/test_zero_engine.py and test_precision_bf16.py",
    # parallel/
    "parallel/mpu.py": "queries of megatron-core's parallel state, needs process groups: the optimizer's and the "
                       "TP checkpoint's (tests/unit/optim/test_muon_tp.py) and the multi-rank runs in "
                       "tests/integration/parallel/",
    # probes/
    "probes/cli.py": "tools/probe_geometry.py's command line: tests/integration/probes/test_probe_geometry.py",
    "probes/report.py": "the probe report: tests/unit/probes/test_plots.py and figures/test_figures.py",
    "probes/sampling.py": "the probes' text sampling: tests/unit/probes/test_runner.py and "
                          "integration/probes/test_probe_geometry.py",
    # registry/
    "registry/studies.py": "every study: tests/unit/registry/test_registry.py",
    # studies/
    "studies/archive.py": "study archives: tests/unit/studies/test_report.py and test_reanalysis.py",
    "studies/docs.py": "the studies' generated docs: tests/unit/studies/test_reanalysis.py",
    "studies/pilots.py": "pilot summaries behind the plans' seed counts: tests/unit/studies/test_plans.py",
    "studies/plan.py": "study plans: tests/unit/studies/test_plans.py, test_analysis.py and test_report.py",
    "studies/post_hoc.py": "an empty table of post hoc readings: tests/unit/studies/test_report.py",
    # training/
    "training/banner.py": "being changed by issue 41 item 5 (the resolved DeepSpeed settings): "
                          "tests/integration/training/test_console.py and tests/unit/test_dryrun.py",
    "training/loop.py": "the training loop: tests/integration/training/test_train_loop.py and test_train_resume.py",
    "training/preflight.py": "being changed by issue 41 item 5: tests/integration/training/test_console.py and "
                             "tests/unit/training/test_setup.py",
    "training/step.py": "being changed by issue 46 (exit objectives): tests/integration/training/test_design_runs.py",
}


def _unit_test_of(module: str) -> str:
    folder, _, name = module.rpartition("/")
    return f"tests/unit/{folder + '/' if folder else ''}test_{name[:-3]}.py"


def _modules() -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def test_every_module_has_a_unit_test_or_a_reason():
    missing = [m for m in _modules() if not (REPO / _unit_test_of(m)).is_file()]
    new = [f"{m} (expected {_unit_test_of(m)})" for m in missing if m not in WITHOUT_UNIT_TEST]
    assert not new, f"modules without a unit test file: {new}; write one (the list here only shrinks)"


def test_the_list_only_holds_modules_still_without_one():
    modules = set(_modules())
    stale = [m for m in WITHOUT_UNIT_TEST if m not in modules or (REPO / _unit_test_of(m)).is_file()]
    assert not stale, f"remove from WITHOUT_UNIT_TEST (gone, or it has a unit test file now): {stale}"
    assert all(reason.strip() for reason in WITHOUT_UNIT_TEST.values())
