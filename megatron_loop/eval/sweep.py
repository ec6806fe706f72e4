"""Loop sweep (paper Sec. 2.3, App. C.3): load an exported model once, then for every
inference loop count r run the zero-shot suite and the held-out loss, and record scores
against effective depth L(r) = p + r·s + c."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.eval import heldout  # module-qualified: tests interrupt a sweep through heldout.heldout_loss
from megatron_loop.eval.harness import evaluate_tasks, load_tasks, make_lm, task_manager, trained_depths
from megatron_loop.eval.one_pass import SweepPasses, sweep_passes
from megatron_loop.eval.tasks import GROUPS, TaskSpec, aggregate, aggregate_stderr
from megatron_loop.export.load import load_hf_model


@dataclass
class SweepSettings:
    loops: list[int]
    tasks: list[TaskSpec] = field(default_factory=list)  # empty: held-out loss only
    limit: int | float | None = None
    include_paths: list[str] = field(default_factory=list)
    valid_prefix: str | None = None
    seq_length: int | None = None  # held-out windows; None: the export's train_seq_length (resolve_seq_length)
    valid_sequences: int | None = None
    batch_size: int = 8
    progress: bool = True
    device: str | None = None  # default: cuda when available, else cpu
    dtype: str = "float32"     # float32 | bfloat16 | float16
    one_pass: bool = True      # every r from one forward per batch where the trajectory allows (one_pass.py)

    def __post_init__(self) -> None:
        """Bad settings stop here, before the model or any dataset is loaded (messages name the CLI flags)."""
        if not self.loops or any(r < 1 for r in self.loops) or sorted(set(self.loops)) != list(self.loops):
            raise LoopConfigError(f"--loops {self.loops}: expected distinct loop counts >= 1 in increasing order")
        if self.limit is not None and not (0 < self.limit < 1 or (self.limit >= 1 and self.limit == int(self.limit))):
            raise LoopConfigError(f"--limit {self.limit}: expected a number of items per task (an integer >= 1) "
                                  "or a fraction of each task in (0, 1)")
        if not self.tasks and not self.valid_prefix:
            raise LoopConfigError("--tasks none: nothing to evaluate; pass --valid-prefix P (an indexed prefix, "
                                  "P.bin/P.idx) for the held-out loss, or name tasks to run")
        if self.valid_prefix:
            missing = [f"{self.valid_prefix}{ext}" for ext in (".bin", ".idx")
                       if not Path(f"{self.valid_prefix}{ext}").is_file()]
            if missing:
                raise LoopDataError(f"--valid-prefix {self.valid_prefix}: missing {' and '.join(missing)}; expected "
                                    "P.bin and P.idx written by tools/preprocess_data.py")
        # a held-out window of L tokens makes L - 1 predictions, so it needs two
        for name, value, least in (("--seq-length", self.seq_length, 2), ("--batch-size", self.batch_size, 1),
                                   ("--valid-sequences", self.valid_sequences, 1)):
            if value is not None and value < least:
                raise LoopConfigError(f"{name} {value}: expected an integer >= {least}")
        if self.device is not None:
            check_device(self.device)
        for folder in self.include_paths:
            check_task_folder(folder)


def check_device(device: str) -> None:
    """``--device``: cpu, or cuda[:N] where CUDA is there (torch names devices it has no backend for here)."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise LoopConfigError(f"--device {device}: not a device this tool runs on; expected cpu, cuda or cuda:N "
                              "(default: cuda when available)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise LoopConfigError(f"--device {device}: CUDA is not available on this machine (torch "
                              f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
                              "expected --device cpu, or no --device (cuda when available)")


def check_task_folder(folder: str) -> None:
    """``--include-path``: a folder holding lm-eval task YAMLs (lm-eval itself ignores anything else
    and then answers only "task not found")."""
    path = Path(folder)
    if not path.is_dir():
        raise LoopConfigError(f"--include-path {folder}: {'not a folder' if path.exists() else 'not found'}; "
                              "expected a folder of lm-eval task YAML files (such as the demo's data/corpus/eval)")
    if next(path.rglob("*.yaml"), None) is None:
        raise LoopConfigError(f"--include-path {folder}: no *.yaml in it; expected a folder of lm-eval task YAML "
                              "files (such as the demo's data/corpus/eval)")


# An r beyond this many times K is refused unless asked for (--no-loop-limit): one forward at r
# costs L(r)/L(K) forwards at the training depth, and the paper's sweeps stay within a few K (Sec. 3).
LOOP_LIMIT_FACTOR = 16


def check_loop_limit(model_dir: str | Path, config: dict, counts: dict[str, int]) -> None:
    """Refuse a loop count ``counts[flag]`` above :data:`LOOP_LIMIT_FACTOR` x the export's K, before
    the model is loaded (``--loops 100000`` ran for hours without a word). A native export is NonLoop
    (r = 1 only, :func:`set_loops`)."""
    if config.get("model_type") != "looplm":
        return
    k = int(config.get("train_loops") or 1)
    p, s, c = (int(config.get(key) or 0) for key in ("prelude_layers", "core_layers", "coda_layers"))
    limit = LOOP_LIMIT_FACTOR * k
    for flag, r in counts.items():
        if r is not None and r > limit:
            cost = (p + r * s + c) / (p + k * s + c)
            raise LoopConfigError(
                f"{flag} {r}: r = {r:,} is {r / k:,.0f} x the training loop count K = {k} of "
                f"{Path(model_dir) / 'config.json'} (each forward costs {cost:,.0f} x one at r = K); expected "
                f"r <= {LOOP_LIMIT_FACTOR} K = {limit}, or pass --no-loop-limit to run it anyway")


# Exports written before the training length was recorded; the paper trains at 2,048 (App. C.1).
FALLBACK_SEQ_LENGTH = 2048


def resolve_seq_length(settings: SweepSettings, model_dir: str | Path, config: dict) -> list[str]:
    """Set ``settings.seq_length`` for the held-out loss: the export's ``train_seq_length`` unless
    ``--seq-length`` says otherwise. Returns the warnings to print: a window longer than training
    measures length extrapolation, not the loop count (a model trained at 128 tokens and read at
    2,048 ranks r differently); and a note when ``--valid-sequences`` asks for more windows than the prefix
    holds (all of them are read)."""
    trained = config.get("train_seq_length")
    where = f"{Path(model_dir) / 'config.json'}"
    lines = []
    if settings.seq_length is None:
        settings.seq_length = FALLBACK_SEQ_LENGTH if trained is None else int(trained)
        if trained is None and settings.valid_prefix:
            lines.append(f"warning: {where} has no train_seq_length (exported before it was recorded): the held-out "
                         f"loss uses windows of {FALLBACK_SEQ_LENGTH} tokens; pass --seq-length with the training "
                         "train.seq_length")
    elif settings.valid_prefix and trained is not None and settings.seq_length > trained:
        lines.append(f"warning: --seq-length {settings.seq_length} is longer than the {trained} tokens the model was "
                     f"trained on ({where} train_seq_length): the held-out loss then measures length extrapolation "
                     "too")
    if settings.valid_prefix and settings.valid_sequences is not None:
        from megatron_loop.plan import prefix_tokens

        held = (prefix_tokens(settings.valid_prefix) or 0) // settings.seq_length
        if settings.valid_sequences > held:  # the loss reads what is there: said, not silently fewer
            lines.append(f"note: --valid-sequences {settings.valid_sequences:,}: {settings.valid_prefix} holds "
                         f"{held:,} sequences of {settings.seq_length} tokens; the held-out loss reads all of them")
    return lines


# A fractional --limit that leaves fewer items of a task than this is said (a score of 1 item is 0 or 100 %)
FEW_ITEMS = 20


def limit_warnings(settings: SweepSettings, tasks: dict | None) -> list[str]:
    """``--limit 0.0001``: the items each task keeps (lm-eval takes ceil(n x limit) of a fraction), said for
    a task left with fewer than :data:`FEW_ITEMS` (it evaluated 1 item and reported "facts 0" without a word)."""
    if not tasks or settings.limit is None or settings.limit >= 1:
        return []
    lines = []
    for name, task in sorted(tasks.items()):
        docs = getattr(task, "eval_docs", None)
        n = len(docs) if docs is not None else None
        if n and math.ceil(n * settings.limit) < FEW_ITEMS:
            lines.append(f"warning: --limit {settings.limit:g} keeps {math.ceil(n * settings.limit)} of the {n:,} "
                         f"items of lm-eval task {name!r}: its score moves by {100 / math.ceil(n * settings.limit):.0f} "
                         "points per item; pass a larger --limit (or none) for a score to compare")
    return lines


def architecture(config) -> dict:
    """p, s, c, K of a LoopLM export (a native Llama/Qwen3 export is NonLoop L×1) and its vocabulary
    size |V| (the loss figure's ln|V| line: the loss of a uniform prediction)."""
    if config.model_type == "looplm":
        from megatron_loop.registry.architectures import Conditioning  # the paper's legend notation

        conditioning = Conditioning(initial=config.initial_injection, history=config.history_injection,
                                    window=config.history_window, timestep=config.timestep).label
        return {"prelude_layers": config.prelude_layers, "core_layers": config.core_layers,
                "coda_layers": config.coda_layers, "train_loops": config.train_loops, "vocab_size": config.vocab_size,
                "conditioning": conditioning}
    return {"prelude_layers": 0, "core_layers": config.num_hidden_layers, "coda_layers": 0, "train_loops": 1,
            "vocab_size": config.vocab_size, "conditioning": "none"}


def set_loops(model, r: int) -> None:
    if model.config.model_type == "looplm":
        model.config.num_loops = r
    elif r != 1:
        raise LoopConfigError(f"--loops {r}: a native {model.config.model_type} export is NonLoop; only r = 1 runs")


@dataclass
class SweepSession:
    """What every sweep of one ``eval_loops.py`` call shares, loaded once: the export, its
    tokenizer, lm-eval's task objects (datasets read once) and lm-eval's wrapper of the model.
    The fixed-r sweep and the adaptive-exit sweep (``adaptive.py``) only change the model's
    config (``num_loops``, ``exit_*``) between evaluations."""

    model_dir: Path
    model: Any
    tokenizer: Any
    manager: Any = None  # lm-eval TaskManager (None without tasks)
    tasks: dict | None = None
    lm: Any = None       # lm-eval HFLM around ``model``


def open_session(model_dir: str | Path, settings: SweepSettings) -> SweepSession:
    # One bar per sweep, its own over r (settings.progress): no download, weight-loading or per-request
    # bars nested under it (one readable log per sweep)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    manager = tasks = None
    if settings.tasks:  # before the model: a task that cannot be loaded (offline hub) fails fast
        manager = task_manager(settings.include_paths, names={t for s in settings.tasks for t in s.lm_eval_tasks})
        tasks = load_tasks(settings.tasks, manager)  # once: datasets read once for every r
    model, tokenizer = load_hf_model(model_dir, settings.device, settings.dtype)
    for r in settings.loops:  # refuse before spending any time
        set_loops(model, r)
    lm = None
    if settings.tasks:
        lm = make_lm(model, tokenizer, settings.batch_size, progress=False)  # lm-eval's nested bars: off
    return SweepSession(Path(model_dir), model, tokenizer, manager, tasks, lm)


def sweep_fingerprint(model_dir: str | Path, settings: SweepSettings) -> dict:
    """What ``results.json`` records of the call that wrote it (``sweep_settings``): the export (its
    config.json by hash, its weight files by size and time) and every setting that changes a
    number except the loop counts. A later call with the same fingerprint resumes the sweep."""
    folder = Path(model_dir).resolve()
    weights = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.glob("*.safetensors"))]
    held = settings.valid_prefix is not None
    return {"model": str(folder),
            "config_sha256": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest(),
            "weights": weights, "tasks": [[t.key, list(t.lm_eval_tasks), t.metric] for t in settings.tasks],
            "limit": settings.limit, "include_paths": [str(Path(p).resolve()) for p in settings.include_paths],
            "valid_prefix": str(Path(settings.valid_prefix).resolve()) if held else None,
            "seq_length": settings.seq_length if held else None,
            "valid_sequences": settings.valid_sequences if held else None, "dtype": settings.dtype}


def run_sweep(session: SweepSession | None, settings: SweepSettings, label: str | None = None,
              previous: dict | None = None, on_result: Callable[[dict], None] | None = None,
              on_passes: Callable[[SweepPasses], None] | None = None) -> dict:
    """The fixed-r sweep. ``previous``: the results of an interrupted (or shorter) sweep with the
    same :func:`sweep_fingerprint`; its loop counts are kept and not evaluated again (``session``
    may be None when none is left). ``on_result`` receives the results after each new r.

    Where the export's trajectory does not depend on r, every r comes from one forward per batch
    (``one_pass.py``; the numbers are bitwise those of one pass per r), else one pass per r;
    ``on_passes`` receives which (also appended to results ``sweep_passes``)."""
    done = sorted(previous["loops"]) if previous else []
    todo = [r for r in settings.loops if r not in done]
    if previous:
        results = copy.deepcopy(previous)
        results["label"] = label if label is not None else previous.get("label")
    else:
        results = _empty_results(session, settings, label)
    if not todo:
        return results
    model, lm = session.model, session.lm
    k = results["train_loops"]
    if settings.tasks and not previous:
        results["trained_depths"] = trained_depths(settings.tasks, session.tasks)
    passes = sweep_passes(model, todo, settings.one_pass)
    if on_passes is not None:
        on_passes(passes)
    results["sweep_passes"] = [*results.get("sweep_passes", []), passes.record()]
    with contextlib.ExitStack() as stack:
        if passes.one_pass and lm is not None:
            stack.enter_context(lm.one_pass(todo))
        _sweep_loops(results, session, settings, todo, passes.one_pass, on_result)
    if model.config.model_type == "looplm":
        set_loops(model, k)
    return results


def _sweep_loops(results: dict, session: SweepSession, settings: SweepSettings, todo: list[int], one_pass: bool,
                 on_result: Callable[[dict], None] | None) -> None:
    """Evaluate ``todo`` into ``results``, one r after the other (with ``one_pass`` the first r's
    forwards serve them all)."""
    from tqdm.auto import tqdm

    model, manager, tasks, lm = session.model, session.manager, session.tasks, session.lm
    held = None  # one-pass: the held-out loss of every r, from the first r's forwards
    for r in tqdm(todo, desc="loop sweep", unit="r", disable=not settings.progress):
        set_loops(model, r)
        results["effective_depth"][r] = results["prelude_layers"] + r * results["core_layers"] + results["coda_layers"]
        if settings.tasks:
            out = evaluate_tasks(lm, settings.tasks, manager, settings.limit, tasks)
            for key, avg in out.subtask_averages.items():  # BBH: the paper's mean and lm-eval's size-weighted one
                results["subtask_averages"].setdefault(key, {})[r] = avg
            for key, value in out.scores.items():
                results["tasks"][key][r] = value
                results["tasks_stderr"][key][r] = out.stderr[key]
            for group, value in aggregate(out.scores, settings.tasks).items():
                results["groups"][group][r] = value
            for group, value in aggregate_stderr(out.stderr, settings.tasks).items():
                results["groups_stderr"][group][r] = value
            results["chance"] = out.chance  # the same items at every r
            results["items"] = out.items  # n per task: comparisons check it (tools/eval_loops.py --compare)
            results["groups_chance"] = aggregate(out.chance, settings.tasks)
            for key, strata in out.per_depth.items():
                results["per_depth"].setdefault(key, {})[r] = strata
                results["depth_axes"][key] = next(t.depth_axis for t in settings.tasks if t.key == key) or "depth"
        if settings.valid_prefix:
            if not one_pass:
                results["heldout"][r] = heldout.heldout_loss(model, settings.valid_prefix, settings.seq_length,
                                                             settings.valid_sequences, batch_size=settings.batch_size)
            else:
                if held is None:
                    held = heldout.heldout_loss(model, settings.valid_prefix, settings.seq_length,
                                                settings.valid_sequences, batch_size=settings.batch_size, loops=todo)
                results["heldout"][r] = held[r]
        results["loops"] = sorted([*results["loops"], r])
        if on_result is not None:
            on_result(results)


def _empty_results(session: SweepSession, settings: SweepSettings, label: str | None) -> dict:
    arch = architecture(session.model.config)
    p, s, c, k = arch["prelude_layers"], arch["core_layers"], arch["coda_layers"], arch["train_loops"]
    return {
        "model": str(session.model_dir), "label": label, "layout": f"{p}+{s}x{k}+{c}", **arch,
        "training_depth": p + k * s + c, "loops": [], "effective_depth": {},
        "metrics": {t.key: t.metric for t in settings.tasks}, "groups_of": {t.key: t.group for t in settings.tasks},
        "lm_eval_tasks": {t.key: list(t.lm_eval_tasks) for t in settings.tasks}, "limit": settings.limit,
        "tasks": {t.key: {} for t in settings.tasks}, "groups": {g: {} for g in (*GROUPS, "overall")},
        "tasks_stderr": {t.key: {} for t in settings.tasks}, "groups_stderr": {g: {} for g in (*GROUPS, "overall")},
        "chance": {}, "groups_chance": {}, "per_depth": {}, "depth_axes": {}, "trained_depths": {}, "heldout": {},
        "subtask_averages": {}, "seq_length": settings.seq_length if settings.valid_prefix else None,
        # |V| of the tokenizer: the tokens the model can meet (vocab_size may be padded above it)
        "tokenizer_vocab_size": len(session.tokenizer) if session.tokenizer is not None else None,
    }
