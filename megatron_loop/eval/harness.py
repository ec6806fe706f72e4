"""One lm-evaluation-harness pass at one loop count r, on an in-memory model.

``lm_eval.simple_evaluate`` with ``HFLM(pretrained=model)`` (zero-shot, log-likelihood
multiple choice, logged samples). Returns the headline score of every task (percent; BBH =
unweighted mean of its subtasks), accuracy per ``depth`` of the logged samples, and for every
task made of subtasks both averages (:func:`~megatron_loop.eval.tasks.subtask_averages`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from megatron_loop.errors import LoopDataError
from megatron_loop.eval.tasks import TASKS_DIR, TaskSpec, mean, subtask_averages


def task_manager(include_paths: list[str] | None = None):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(TASKS_DIR), *(str(Path(p)) for p in include_paths or [])])


def make_lm(model, tokenizer, batch_size: int = 8):
    from lm_eval.models.huggingface import HFLM

    # trust_remote_code: the model is our own export (already loaded); without it lm-eval asks on stdin.
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, trust_remote_code=True)


def depth_accuracy(samples: list[dict], metric: str) -> dict[int, dict[str, float]]:
    """Accuracy (percent) and item count per ``doc['depth']`` of lm-eval logged samples."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        depth = sample["doc"].get("depth")
        if depth is not None:
            buckets[int(depth)].append(float(sample[metric]))
    return {d: {"accuracy": 100.0 * mean(v), "n": len(v)} for d, v in sorted(buckets.items())}


def evaluate_tasks(lm, specs: list[TaskSpec], manager, limit: int | float | None = None) -> tuple[dict, dict, dict]:
    """(scores {task key: percent}, per_depth {task key: {depth: {accuracy, n}}}, averages {task key
    of several subtasks: subtask_averages}) at the model's current r."""
    import lm_eval

    names = sorted({t for s in specs for t in s.lm_eval_tasks})
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise LoopDataError(f"lm-eval task {unknown[0]!r} not found; expected a stock task, one of "
                            "megatron_loop/eval/tasks, or a task under --include-path")
    out = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=0, limit=limit, log_samples=True,
                                  task_manager=manager, bootstrap_iters=0, verbosity="WARNING")
    results, samples = out["results"], out["samples"]
    scores, per_depth, averages = {}, {}, {}
    for spec in specs:
        values = []
        for name in spec.lm_eval_tasks:
            key = f"{spec.metric},none"
            if key not in results.get(name, {}):
                raise LoopDataError(f"lm-eval task {name!r} reports no {spec.metric!r}; expected a multiple-choice "
                                    "task with that metric")
            values.append(100.0 * results[name][key])
        scores[spec.key] = mean(values)
        if len(spec.lm_eval_tasks) > 1:
            sizes = {n: len(samples[n]) for n in spec.lm_eval_tasks}  # items each subtask evaluated
            averages[spec.key] = subtask_averages(dict(zip(spec.lm_eval_tasks, values)), sizes)
        if spec.depth_axis is not None and len(spec.lm_eval_tasks) == 1:
            strata = depth_accuracy(samples[spec.lm_eval_tasks[0]], spec.metric)
            if strata:
                per_depth[spec.key] = strata
    return scores, per_depth, averages
