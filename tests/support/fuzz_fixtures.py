"""The harness of the bad-input fuzz suite (issue 43: bad inputs closed as a class, not case by case).

Every command line runs in this process through its script's ``main(argv)`` as its ``__main__`` runs it
(``run_cli``), from an empty scratch working directory, under an alarm (:data:`TIME_BOUND_S`), with the
launch environment it is given; the point where real work starts (training's process group, an export's
consolidation, a sweep's model load, ...: :data:`WORK`) raises instead of working, so an accepted input
costs milliseconds and the property holds for what a command checks before it works. :func:`check`
asserts the invariants of docs/ERRORS.md on the outcome: exit 0 or the work reached, or exit 2 with
exactly one ``error:`` line; never a traceback; within the bound; nothing written by a refused call.

The sample that ``make test`` runs is derandomized and small (each property's own ``examples``);
``LOOPLM_FUZZ_EXAMPLES=N`` runs N random examples per property (failures are kept in ``.hypothesis/``
and replayed first the next time):

    LOOPLM_FUZZ_EXAMPLES=2000 python -m pytest -q -p no:cacheprovider tests/integration/cli/test_fuzz_cli.py \\
        tests/integration/cli/test_fuzz_config.py tests/integration/hf/test_fuzz_export.py
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from testpaths import REPO, load_script

LONG_RUN = int(os.environ.get("LOOPLM_FUZZ_EXAMPLES", "0") or 0)
# A call that checks its input and stops takes well under a second once its modules are imported (the first
# call of a script imports torch, transformers or lm-eval: tens of seconds on a loaded 2-core machine); the
# bound catches a hang (before: num_loops=10**9 never returned), not a slow import.
TIME_BOUND_S = 120.0
# ours, and argparse's "prog: error: ..." (a subcommand's prog has two words: "paired_study.py plan: error: ...")
ERROR_LINE = re.compile(r"^(?:[\w.+-]+(?: [\w.+-]+)?: )?error: ")


def fuzz_settings(examples: int) -> settings:
    """The sample: ``examples`` derandomized examples (the same every run, no database). The long run
    (``LOOPLM_FUZZ_EXAMPLES``): that many random ones, failures kept in ``.hypothesis/`` and replayed."""
    common = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
    if LONG_RUN:
        return settings(max_examples=LONG_RUN, database=DirectoryBasedExampleDatabase(str(REPO / ".hypothesis")),
                        **common)
    return settings(max_examples=examples, derandomize=True, database=None, **common)


class Reached(BaseException):
    """The call got past its checks to where the work starts (BaseException: no ``except Exception`` of the
    code under test takes it for a failure of its own)."""


class TimedOut(BaseException):
    pass


@dataclass
class Outcome:
    code: int | str  # exit code, "reached <work>" or "timeout"
    stdout: str
    stderr: str
    seconds: float
    written: list[str] = field(default_factory=list)  # files created or changed under the watched folders

    @property
    def accepted(self) -> bool:
        return self.code == 0 or str(self.code).startswith("reached")

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if ERROR_LINE.match(line)]

    def describe(self) -> str:
        return f"exit {self.code} after {self.seconds:.1f} s; written {self.written[:3]}\nstderr:\n{self.stderr[-3000:]}"


# script -> [(module, attribute, work)]: where the work of each command starts; reached, it raises Reached.
# "<script>" names the loaded script module itself (its own imported name).
WORK = {
    "pretrain_loop.py": [("megatron_loop.training.setup", "distributed.setup_distributed", "process group")],
    "tools/convert_to_hf.py": [("megatron_loop.export.convert", "read_weights_or_newest", "consolidation")],
    "tools/eval_loops.py": [("megatron_loop.eval.sweep", "load_hf_model", "model load")],
    "tools/probe_geometry.py": [("megatron_loop.probes.cli", "load_model", "model load")],
    "tools/preprocess_data.py": [("megatron_loop.data.preprocess", "_PrefixWriter", "first write")],
    "tools/train_tokenizer.py": [("<script>", "train_bpe_tokenizer", "tokenizer training", "after")],
    "tools/make_corpus.py": [("megatron_loop.data.corpus.CorpusSpec", "validate", "corpus generation", "after")],
    "tools/generate_configs.py": [("<script>", "write_all", "rewriting examples/"),
                                  ("<script>", "write_toys", "writing the twins' configs")],
    "tools/plot_metrics.py": [("megatron_loop.curves", "plot_runs", "drawing")],
    "tools/bench.py": [("<script>", "make_setup", "benchmark")],
    # paired_study.py is being rewritten elsewhere: only its argument parser is exercised
    "tools/paired_study.py": [("argparse.ArgumentParser", "parse_args", "parsed arguments", "after")],
}


@functools.lru_cache(maxsize=None)
def script_module(script: str):
    import sys

    path = list(sys.path)
    try:  # bench.py and the tools put their folders first on sys.path; kept for later imports of theirs
        return load_script(script, f"fuzz_{Path(script).stem}")
    finally:
        sys.path[:] = [*path, *(p for p in sys.path if p not in path)]


def _target(script: str, dotted: str):
    """``<script>`` (the loaded script), a module, or an attribute of one (``argparse.ArgumentParser``)."""
    import importlib

    if dotted == "<script>":
        return script_module(script)
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            owner = getattr(owner, part)
        return owner
    raise ImportError(dotted)


@contextlib.contextmanager
def _work_stops(script: str):
    """Patch the points where ``script`` starts its work to raise :class:`Reached` (``after``: once the patched
    function returned, its own checks done)."""
    import megatron_loop.cli as cli

    # every call is a launch of its own: the once-per-launch error line (cli._first_to_report, keyed by the
    # launcher process, here always pytest) is printed by each
    undo = [(cli, "_first_to_report", cli._first_to_report)]
    cli._first_to_report = lambda line: True
    for entry in WORK[script]:
        module, attribute, work = entry[:3]
        after = len(entry) > 3
        owner = _target(script, module)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def stop(*args, _original=original, _work=work, _after=after, **kwargs):
            if _after:
                _original(*args, **kwargs)
            raise Reached(_work)

        setattr(owner, name, stop)
        undo.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


def _set_environment(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def environment(values: dict[str, str | None]):
    """``os.environ`` with ``values`` set (None: removed), restored after."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_environment(values)
        yield
    finally:
        _set_environment(saved)


@contextlib.contextmanager
def time_bound(seconds: float):
    def expire(signum, frame):
        raise TimedOut()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    files = {}
    for folder in folders:
        if folder.is_dir():
            for p in folder.rglob("*"):
                with contextlib.suppress(OSError):
                    # packed-dataset index caches (data/packed.py) are a cache of the data, not an output
                    if (p.is_file() or p.is_symlink()) and ".pack-" not in p.name:
                        st = p.lstat()
                        files[str(p)] = (st.st_size, st.st_mtime_ns)
    return files


# The launch variables no call may inherit from the test process (each call states its own)
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                    "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def run_entry(script: str, argv: list[str], env: dict[str, str | None] | None = None,
              watch: tuple[Path, ...] = (), bound: float = TIME_BOUND_S) -> Outcome:
    """``script``'s ``main(argv)`` as its ``__main__`` runs it, in a fresh scratch working directory."""
    from megatron_loop.cli import run_cli

    module = script_module(script)
    cwd = Path(tempfile.mkdtemp(prefix="fuzz_cwd_"))
    out, err = io.StringIO(), io.StringIO()
    env = {**{k: None for k in LAUNCH_VARIABLES}, **(env or {})}
    before = snapshot(cwd, *watch)
    start = time.perf_counter()
    try:
        with contextlib.chdir(cwd), environment(env), _work_stops(script), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with time_bound(bound):
                    code = run_cli(module.main, argv)
            except SystemExit as e:  # argparse, bench's fail()
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Reached as e:
                code = f"reached {e}"
            except TimedOut:
                code = "timeout"
            except Exception:  # what the interpreter would print: a traceback, exit 1
                traceback.print_exc()
                code = 1
        seconds = time.perf_counter() - start
        after = snapshot(cwd, *watch)
        written = sorted(k for k, v in after.items() if before.get(k) != v)
        return Outcome(code, out.getvalue(), err.getvalue(), seconds, written)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def check(outcome: Outcome, names: tuple[str, ...] = ()) -> None:
    """The invariants of every bad input (docs/ERRORS.md): accepted (exit 0, or its work reached), or exit 2
    with exactly one ``error:`` line (naming one of ``names`` when given) and nothing written; never a
    traceback; within the time bound."""
    assert "Traceback (most recent call last)" not in outcome.stderr, outcome.describe()
    assert outcome.code != "timeout", outcome.describe()
    assert outcome.accepted or outcome.code == 2, outcome.describe()
    if outcome.code == 2:
        assert len(outcome.errors) == 1, outcome.describe()
        assert not outcome.written, outcome.describe()
        if names:
            assert any(n in outcome.errors[0] for n in names), (names, outcome.describe())


def refused(outcome: Outcome, pattern: str) -> None:
    """Exit 2, one error line matching ``pattern``, nothing written, no traceback."""
    check(outcome)
    assert outcome.code == 2, outcome.describe()
    assert re.search(pattern, outcome.errors[0]), (pattern, outcome.errors[0])


# ----------------------------------------------------------------------------------------------------------
# Assets: a tiny corpus, tokenizer, indexed prefix, run config, checkpoint folder and HF export, built once


@dataclass(frozen=True)
class FuzzAssets:
    root: Path
    corpus: Path        # a .jsonl of a few documents
    tokenizer: Path     # a trained BPE folder (about 300 tokens)
    prefix: str         # P.bin/P.idx of the corpus, with P_valid
    config: Path        # a tiny run config on the prefix (its output_dir under root/runs)
    checkpoint: Path    # a checkpoint folder as training writes it (latest, global_step1 with a manifest, run config)
    export: Path        # an HF export of the tiny LoopLM (random weights)
    metrics: Path       # a run folder with a metrics.jsonl of two steps

    def folders(self) -> tuple[Path, ...]:
        return (self.root,)


TINY_MODEL = {"backbone": "tiny-llama", "core_layers": 1, "train_loops": 2, "hidden_size": 32,
              "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 320,
              "activation_checkpointing": "none"}


@functools.lru_cache(maxsize=None)
def fuzz_assets() -> FuzzAssets:
    import atexit

    import yaml

    from megatron_loop.checkpoint.folders import save_run_config
    from megatron_loop.checkpoint.manifest import write_manifest
    from megatron_loop.config import load_config
    from megatron_loop.data.preprocess import PreprocessOptions, preprocess
    from megatron_loop.data.tokenizer import train_bpe_tokenizer

    root = Path(tempfile.mkdtemp(prefix="looplm_fuzz_assets_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    words = "the cat sat on a mat while every loop of the model reads its state again and again".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40 + i % 9)) for i in range(80)]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = train_bpe_tokenizer(texts, root / "tokenizer", vocab_size=300)
    prefix = str(root / "data" / "corpus")
    preprocess(str(corpus), str(tokenizer), prefix, PreprocessOptions(validation_documents=20, progress=False))
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "model": TINY_MODEL,
        "train": {"seq_length": 16, "global_batch_size": 4, "micro_batch_size": 2, "max_steps": 4, "lr": 3e-3,
                  "precision": "fp32", "output_dir": str(root / "runs" / "tiny"), "save_interval": 2,
                  "eval_interval": 2, "eval_batches": 1, "deepspeed_config": str(REPO / "deepspeed_configs" /
                                                                                     "zero1.json")},
        "data": {"train_prefixes": [prefix], "tokenizer": str(tokenizer), "num_workers": 0},
        "logging": {"progress_bar": False, "dynamics_interval": 0}}))
    checkpoint = root / "ckpt_run" / "checkpoints"
    tag = checkpoint / "global_step1"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"not read: the consolidation is where the work starts")
    write_manifest(tag, {"step": 1})
    (checkpoint / "latest").write_text("global_step1")
    save_run_config(checkpoint, load_config(config))
    export = root / "hf"
    _write_export(export, tokenizer)
    metrics = root / "metrics_run"
    metrics.mkdir()
    (metrics / "metrics.jsonl").write_text('{"event": "train", "step": 1, "loss": 5.0, "lr": 0.001}\n'
                                           '{"event": "train", "step": 2, "loss": 4.5, "lr": 0.001}\n')
    return FuzzAssets(root, corpus, tokenizer, prefix, config, checkpoint, export, metrics)


def tiny_hf_config(**overrides):
    """The export's config of :data:`TINY_MODEL` (what ``hf_config`` writes), with ``overrides``."""
    from megatron_loop.hf.modeling_looplm import LoopLMConfig

    fields = {k: v for k, v in TINY_MODEL.items() if k not in ("backbone", "activation_checkpointing")}
    return LoopLMConfig(**{"head_dim": 16, **fields, "history_injection": "scalar", "history_window": 2,
                           **overrides})


def _write_export(folder: Path, tokenizer: Path) -> None:
    import torch

    from megatron_loop.hf.modeling_looplm import LoopLMForCausalLM

    torch.manual_seed(0)
    model = LoopLMForCausalLM(tiny_hf_config(train_seq_length=16))
    model.save_pretrained(folder)
    shutil.copy(REPO / "megatron_loop" / "hf" / "modeling_looplm.py", folder / "modeling_looplm.py")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
