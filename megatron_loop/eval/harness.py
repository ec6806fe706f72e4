"""One lm-evaluation-harness pass at one loop count r, on an in-memory model.

``lm_eval.simple_evaluate`` with ``HFLM(pretrained=model)`` (zero-shot, log-likelihood
multiple choice, logged samples). The tasks are built once per sweep (:func:`load_tasks`:
datasets read once, zero-shot set once) and reused at every r. Per pass it returns, for every
task, the headline score (percent; BBH = unweighted mean of its subtasks), its standard error
(lm-eval's, propagated through the mean), the chance level of its items, and the same three per
``depth`` stratum for every task whose documents carry a ``depth`` field; for every task made of
subtasks (BBH) both averages (:func:`~megatron_loop.eval.tasks.subtask_averages`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from megatron_loop.errors import LoopDataError
from megatron_loop.eval.tasks import TASKS_DIR, TaskSpec, mean, stderr_of_mean, subtask_averages

# lm-eval computes closed-form standard errors for mean-aggregated metrics (acc, acc_norm) as soon as
# bootstrap_iters > 0; the count only matters for bootstrapped metrics, which the suite does not use.
STDERR_BOOTSTRAP_ITERS = 1000
LOCAL_TASKS_HINT = ("--tasks facts,clutrr=looplm_clutrr_local,proofwriter=looplm_proofwriter_local,"
                    "bbh=looplm_tracking_local --include-path CORPUS/eval (written by tools/make_corpus.py)")


@dataclass
class TaskResults:
    """One pass at one r. Percentages; ``stderr`` is None where lm-eval reports none (one item)."""

    scores: dict[str, float]
    stderr: dict[str, float | None]
    chance: dict[str, float]                      # mean over items of 1 / number of choices
    per_depth: dict[str, dict[int, dict]]         # task -> depth -> {accuracy, stderr, chance, n}
    # task of several subtasks (BBH) -> {mean, size_weighted, subtasks: {name: {accuracy, n}}}
    subtask_averages: dict[str, dict] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)  # task -> items scored (all its subtasks)


def task_manager(include_paths: list[str] | None = None, names=None):
    """lm-eval's ``TaskManager`` over ours (``eval/tasks``), ``include_paths`` and its stock tasks.

    With ``names`` (the lm-eval tasks a sweep asks for) all found among ours and ``include_paths``,
    the ~14,700 stock task YAMLs are not indexed (``include_defaults=False``): indexing them costs
    seconds of every sweep's start-up (docs/BENCHMARKS.md). One manager per set of folders is kept
    for the process."""
    paths = tuple(str(Path(p).resolve()) for p in include_paths or [])
    if names is not None:
        local = _task_manager(paths, include_defaults=False)
        if set(names) <= set(local.all_tasks):
            return local
    return _task_manager(paths, include_defaults=True)


@functools.lru_cache(maxsize=8)
def _task_manager(include_paths: tuple[str, ...], include_defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(TASKS_DIR), *include_paths], include_defaults=include_defaults)


def make_lm(model, tokenizer, batch_size: int = 8, progress: bool = True):
    """lm-eval's ``HFLM`` around the loaded model, as :class:`~megatron_loop.eval.sweep_lm.LoopSweepLM`
    (which can serve every r of a sweep from one forward per batch); ``progress=False`` also silences
    the per-request bars that lm-eval's evaluator cannot switch off (it never passes ``disable_tqdm``)."""
    from lm_eval.models.huggingface import HFLM

    from megatron_loop.eval.sweep_lm import LoopSweepLM

    # HFLM warns that an already-built model skips its loading arguments: exactly what is meant here.
    logger = logging.getLogger(HFLM.__module__)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        # trust_remote_code: the model is our own export (already loaded); without it lm-eval asks on stdin.
        return LoopSweepLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, trust_remote_code=True,
                           progress=progress)
    finally:
        logger.setLevel(level)


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def load_tasks(specs: list[TaskSpec], manager) -> dict:
    """The lm-eval task objects of ``specs`` by name, built once for the whole sweep.

    Each is set to zero shots (App. C.3) here, once, instead of lm-eval overriding (and warning)
    at every r. Tasks whose dataset must come from the Hugging Face hub while the hub is
    unreachable are collected into one error that says how to run local tasks instead.
    """
    names = sorted({t for s in specs for t in s.lm_eval_tasks})
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise LoopDataError(f"lm-eval task {unknown[0]!r} not found; expected a stock task, one of "
                            "megatron_loop/eval/tasks, or a task under --include-path")
    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "0") not in ("", "0")]
    why = f"offline mode is on ({', '.join(f'{v}=1' for v in offline)})" if offline else ""
    if not offline:
        unreachable_hub = go_offline_if_hub_unreachable()
        why = f"the hub is unreachable ({unreachable_hub})" if unreachable_hub else "the hub is unreachable"
    tasks, unreachable, reason = {}, [], ""
    for name in names:
        try:
            loaded = manager.load([located_spec(manager, name)])["tasks"]
        except ConnectionError as e:  # datasets/huggingface_hub: offline mode or no network
            unreachable.append(name)
            reason = reason or _one_line(e)
            continue
        except Exception as e:  # a local data file missing, a broken task YAML, ...
            field = re.search(r"unexpected keyword argument '(\w+)'", str(e))
            if isinstance(e, TypeError) and field:  # lm-eval builds its TaskConfig(**yaml): a misspelt field
                raise LoopDataError(f"lm-eval task {name!r}: its YAML sets '{field.group(1)}', a field lm-eval's task "
                                    "config does not have; expected lm-eval's task YAML fields (task, dataset_path, "
                                    "doc_to_text, ...: lm-eval's docs/task_guide.md)") from None
            raise LoopDataError(f"lm-eval task {name!r}: cannot load its dataset ({_one_line(e)})") from None
        for task in loaded.values():
            task.set_config(key="num_fewshot", value=0)
        tasks.update(loaded)
    if unreachable:
        keys = [s.key for s in specs if set(s.lm_eval_tasks) & set(unreachable)]
        raise LoopDataError(f"--tasks: {', '.join(keys)} need datasets from the Hugging Face hub that are not in the "
                            f"local cache, and {why}: {reason}; run once with network access to cache them, or "
                            f"evaluate local tasks ({LOCAL_TASKS_HINT}), or --tasks none for held-out loss only")
    return tasks


def _data_files_map(files, resolve):
    """``data_files`` (a path, a list, or split -> path or list) with ``resolve`` applied to every path."""
    if isinstance(files, dict):
        return {split: _data_files_map(value, resolve) for split, value in files.items()}
    if isinstance(files, list):
        return [resolve(f) for f in files]
    return resolve(files) if isinstance(files, str) else files


def located_spec(manager, name: str):
    """What to load task ``name`` by: its name, or, for a task YAML with local ``data_files``, its
    config with each path located from the YAML's folder. Relative paths are read from the YAML's
    folder (lm-eval itself takes them from the working directory, although it resolves ``include:``
    from the YAML's folder). An absolute path outside the YAML's folder (tools/make_corpus.py writes
    absolute ones, so that plain lm_eval works from anywhere) is a corpus folder copied or moved: the
    file of that name beside the YAML is read when there is one, else the path as written; either way
    one line on stderr names what is read, so a copy never reads the original's items without a word."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = manager.task_index.get(name)
    if entry is None or entry.yaml_path is None or entry.kind is not Kind.TASK:
        return name
    config = load_yaml(entry.yaml_path, resolve_func=True)
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if not files:
        return name
    folder = Path(entry.yaml_path).resolve().parent
    notes = []

    def resolve(path: str) -> str:
        p = Path(path).expanduser()
        if not p.is_absolute():
            return str(folder / p) if (folder / p).exists() else path  # else lm-eval's reading (the cwd)
        if p.resolve().is_relative_to(folder):
            return str(p)
        beside = folder / p.name
        if beside.is_file():
            notes.append(f"reads {beside}, the file of that name beside it, not {p} (its folder was copied or moved)")
            return str(beside)
        notes.append(f"reads {p}: an absolute path outside the task's folder, read as written")
        return str(p)

    config["dataset_kwargs"] = {**config["dataset_kwargs"], "data_files": _data_files_map(files, resolve)}
    for note in notes:
        print(f"note: lm-eval task {name!r} ({entry.yaml_path}) {note}", file=sys.stderr, flush=True)
    return config


# One short request decides whether the hub answers; without it every hub task retries for about
# 30 s before it fails, minutes for the paper's eleven.
HUB_PROBE_TIMEOUT_S = 5.0


def go_offline_if_hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """One HEAD request to the hub (``HF_ENDPOINT``). When it gets no answer, this process switches to
    the hub clients' offline mode (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``): cached datasets still
    load, the others fail at once. Returns why the hub is unreachable, or None when it answered."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout).close()
        return None
    except urllib.error.HTTPError:  # an HTTP answer, whatever its status: the hub is reachable
        return None
    except (OSError, ValueError) as e:  # URLError, timeout, refused, no route, a malformed endpoint
        reason = _one_line(getattr(e, "reason", None) or e)
    import datasets

    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True  # both clients read the variables once, at import
    datasets.config.HF_HUB_OFFLINE = True
    return f"{constants.ENDPOINT}: {reason}"


def _chance(sample: dict) -> float:
    """1 / number of choices of one logged multiple-choice item (one request per choice)."""
    return 1.0 / len(sample["arguments"])


def _stratify(samples: list[dict], metric: str) -> dict[int, dict]:
    """Accuracy, lm-eval's standard error, chance (percent) and item count per ``doc['depth']``."""
    from lm_eval.api.metrics import mean_stderr as lm_eval_mean_stderr

    buckets: dict[int, list[dict]] = defaultdict(list)
    for sample in samples:
        depth = sample["doc"].get("depth")
        if depth is not None:
            buckets[int(depth)].append(sample)
    out = {}
    for depth, items in sorted(buckets.items()):
        values = [float(s[metric]) for s in items]
        out[depth] = {"accuracy": 100.0 * mean(values),
                      "stderr": 100.0 * lm_eval_mean_stderr(values) if len(values) > 1 else None,
                      "chance": 100.0 * mean([_chance(s) for s in items]), "n": len(values)}
    return out


def _stderr(value) -> float | None:
    """lm-eval writes "N/A" where it has no standard error (a single item)."""
    return None if value in (None, "N/A") or (isinstance(value, float) and math.isnan(value)) else float(value)


def evaluate_tasks(lm, specs: list[TaskSpec], manager, limit: int | float | None = None,
                   tasks: dict | None = None) -> TaskResults:
    """Scores, standard errors, chance levels and per-depth cells at the model's current r.

    ``tasks`` are the objects of :func:`load_tasks` (built here when not given).
    """
    import lm_eval

    tasks = load_tasks(specs, manager) if tasks is None else tasks
    names = sorted({t for s in specs for t in s.lm_eval_tasks})
    out = lm_eval.simple_evaluate(model=lm, tasks=[tasks[n] for n in names], limit=limit, log_samples=True,
                                  task_manager=manager, bootstrap_iters=STDERR_BOOTSTRAP_ITERS)
    results, samples = out["results"], out["samples"]
    scores, stderr, chance, per_depth, averages = {}, {}, {}, {}, {}
    items = {spec.key: sum(len(samples[n]) for n in spec.lm_eval_tasks) for spec in specs}
    for spec in specs:
        values, errors = [], []
        for name in spec.lm_eval_tasks:
            key = f"{spec.metric},none"
            if key not in results.get(name, {}):
                raise LoopDataError(f"lm-eval task {name!r} reports no {spec.metric!r}; expected a multiple-choice "
                                    "task with that metric")
            values.append(100.0 * results[name][key])
            se = _stderr(results[name].get(f"{spec.metric}_stderr,none"))
            errors.append(None if se is None else 100.0 * se)
        scores[spec.key] = mean(values)
        stderr[spec.key] = stderr_of_mean(errors)
        chance[spec.key] = mean([100.0 * mean([_chance(s) for s in samples[n]]) for n in spec.lm_eval_tasks])
        if len(spec.lm_eval_tasks) > 1:
            sizes = {n: len(samples[n]) for n in spec.lm_eval_tasks}  # items each subtask evaluated
            averages[spec.key] = subtask_averages(dict(zip(spec.lm_eval_tasks, values)), sizes)
        strata = _stratify([s for n in spec.lm_eval_tasks for s in samples[n]], spec.metric)
        if strata:
            per_depth[spec.key] = strata
    return TaskResults(scores, stderr, chance, per_depth, averages, items)


def trained_depths(specs: list[TaskSpec], tasks: dict) -> dict[str, list[int]]:
    """Depths a task's YAML declares as seen in training (``metadata: trained_depths: [...]``, written
    for the bundled corpus by ``tools/make_corpus.py``), per task key; tasks without it are absent."""
    out = {}
    for spec in specs:
        depths = set()
        for name in spec.lm_eval_tasks:
            metadata = tasks[name].get_config("metadata") or {}
            depths.update(int(d) for d in metadata.get("trained_depths") or [])
        if depths:
            out[spec.key] = sorted(depths)
    return out
