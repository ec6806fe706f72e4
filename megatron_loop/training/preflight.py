"""Checks that run before anything is written: one clear error, nothing partial.

The files a run opens (the DeepSpeed JSON, checked against the YAML by its owner
:mod:`megatron_loop.config.deepspeed`; data prefixes; a local tokenizer), loop counts of the validation sweep, vocabulary of
the tokenized data and tokenizer against the model, and the output folder (what it holds, and
that rank 0 can write there: :func:`check_writable`, right after it took the run lock and before
the model is built).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from megatron_loop.cli import host_cores
from megatron_loop.config import Config
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.data.prefix_files import prefix_file_problem
from megatron_loop.errors import LoopConfigError, LoopDataError, os_error_text
from megatron_loop.plan import data_epochs, prefix_tokens, total_train_steps
from megatron_loop.training.lock import LOCK_NAME
from megatron_loop.training.metrics import METRICS_NAME

CHECKPOINTS = "checkpoints"


def check_eval_loops(cfg: Config) -> list[int]:
    """Loop counts of the periodic validation; the prefix grid cannot run past K (App. C.1)."""
    loops = list(cfg.train.eval_loops or [])
    if any(r < 1 for r in loops):
        raise LoopConfigError(f"train.eval_loops={loops}: expected loop counts >= 1")
    k = cfg.model.train_loops
    if cfg.model.timestep != "none" and cfg.model.timestep_grid == "prefix" and any(r > k for r in loops):
        raise LoopConfigError(
            f"train.eval_loops={loops}: model.timestep_grid='prefix' keeps the training grid of "
            f"K=model.train_loops={k} steps, so every r must be <= {k} (use timestep_grid: rescaled to extrapolate)")
    return loops


def check_input_files(cfg: Config, deepspeed: DeepSpeedSettings) -> dict[str, Any]:
    """The files a run opens exist: DeepSpeed JSON (read and checked against the YAML once, by whoever made
    ``deepspeed``: :meth:`megatron_loop.config.deepspeed.DeepSpeedSettings.of_run`), data prefixes (P.bin
    and P.idx), a local tokenizer. Reads
    ``cfg`` only: its relative paths were made absolute once, where it was loaded
    (:func:`megatron_loop.config.load_config`); one still relative names a file that did not
    exist there, and the message gives the working directory. Returns them as ``--dry-run``
    prints them; the validation prefixes are those the run uses."""
    cwd = os.getcwd()
    cfg.data.train_blend()  # an empty train list is its own error
    valid = cfg.data.validation_prefixes() if cfg.train.eval_interval else []  # only what the run opens
    for key, prefixes in (("train_prefixes", cfg.data.train_prefixes), ("valid_prefixes", valid)):
        for i, prefix in enumerate(prefixes):
            problem = prefix_file_problem(prefix)
            if problem:
                where = "" if os.path.isabs(prefix) else f" (relative to {cwd})"
                raise LoopDataError(f"data.{key}[{i}]: indexed dataset prefix '{prefix}': "
                                    f"{problem}{where}; expected P.bin and P.idx written "
                                    "by tools/preprocess_data.py")
    tok = cfg.data.tokenizer
    if tok and not os.path.exists(tok) and not is_hub_name(tok):
        raise LoopDataError(f"data.tokenizer={tok!r}: no such tokenizer folder or file (relative to {cwd}); "
                            "expected a folder with tokenizer.json or a Hugging Face hub name such as "
                            "meta-llama/Llama-3.1-8B")
    return {**deepspeed.report(), "train_prefixes": list(cfg.data.train_prefixes), "valid_prefixes": valid, "tokenizer": tok}


def check_host(cfg: Config, training: bool = True) -> list[str]:
    """What this host cannot run: more DataLoader workers than its cores (each worker is a process with its own
    copy of the dataset index; data.num_workers=100000 would fork until memory runs out), and Liger's fused
    loss without CUDA. ``training`` False (the dry run, often on a login node without the job's GPUs): the
    device check is a ``warning:`` line returned, not an error."""
    cores = host_cores()
    if cfg.data.num_workers > cores:
        raise LoopConfigError(f"data.num_workers={cfg.data.num_workers}: expected at most the {cores} CPU cores "
                              "this process may use (each DataLoader worker is a process of its own; 0 reads in "
                              "the training process)")
    warnings = []
    if cfg.model.loss_implementation == "fused" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        import torch  # here: only for a config that asks for the CUDA kernel (the dry run stays torch-free)

        if not torch.cuda.is_available():
            message = ("model.loss_implementation='fused': Liger's Triton kernel needs a CUDA device (or "
                       "TRITON_INTERPRET=1 on CPU) and this host has none; expected 'auto' (fused on CUDA, "
                       "chunked elsewhere) or 'chunked'")
            if training:
                raise LoopConfigError(message)
            warnings.append(f"warning: {message} (training on this host would stop here)")
    return warnings


def check_init_from(cfg: Config) -> None:
    """``train.init_from`` names a checkpoint folder with its run config, for the dry run (training selects and
    verifies it, sha256 of every file, and compares the parameters: training/init_from.py): a missing path, a
    file or a Hugging Face export is named as such before a job is queued."""
    if not cfg.train.init_from:
        return
    from megatron_loop.checkpoint.folders import load_run_config
    from megatron_loop.checkpoint.selection import checkpoint_folder_problem, split_checkpoint_path

    path = Path(cfg.train.init_from)
    try:
        problem = checkpoint_folder_problem(path)
        if problem:
            raise LoopDataError(problem)
        load_run_config(split_checkpoint_path(path)[0])
    except LoopDataError as e:
        raise LoopDataError(f"train.init_from={cfg.train.init_from!r}: {e}") from None


def check_data_epochs(cfg: Config) -> None:
    """Training reads no train prefix more than ``data.max_epochs`` times (before: a 4-token corpus
    trained for "1024.00 epochs", exit 0). Beyond a few epochs repeated data stops helping and far
    beyond, the model memorises the corpus. The dry run warns instead (above four epochs, naming this
    refusal beyond the limit): it also plans paper configs against stand-in data."""
    steps = total_train_steps(cfg)  # its own refusals first (a budget below one step, an index beyond memory)
    limit = cfg.data.max_epochs
    for i, (prefix, epochs) in enumerate(data_epochs(cfg, steps).items()):
        if epochs > limit:
            t = cfg.train
            raise LoopDataError(
                f"data.train_prefixes[{i}] '{prefix}': the plan reads {epochs:,.1f} epochs of its "
                f"{prefix_tokens(prefix):,} tokens ({steps:,} steps x {t.global_batch_size} sequences of "
                f"{t.seq_length}); expected at most data.max_epochs={limit:g}: add data, lower train.max_steps or "
                "train.train_tokens, or raise data.max_epochs for a deliberate overfitting run")


def is_hub_name(name: str) -> bool:
    """``org/name`` or ``name`` as the Hugging Face hub spells repository ids (a path with more parts,
    or starting with ``.``, ``/`` or ``~``, is a local path)."""
    return re.fullmatch(r"(?:[\w.-]+/)?[\w.-]+", name) is not None and not name.startswith((".", "~"))


def _tokenizer_vocab(tokenizer: str) -> tuple[Path, int] | None:
    """Vocabulary size of a local tokenizer folder (hub names are not fetched here)."""
    path = Path(tokenizer)
    if not path.exists():
        return None  # a hub name (check_input_files refuses a missing local path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if path.is_dir() and not file.is_file():
        if (path / "tokenizer_config.json").is_file():
            return None  # a tokenizer transformers builds from its other files (vocab/merges, sentencepiece)
        raise LoopDataError(f"data.tokenizer={tokenizer!r}: a folder without tokenizer.json or tokenizer_config.json; "
                            "expected a tokenizer folder saved with save_pretrained (tools/train_tokenizer.py)")
    if file.suffix != ".json":
        raise LoopDataError(f"data.tokenizer={tokenizer!r}: not a tokenizer ({file.name} is not a tokenizer.json); "
                            "expected a tokenizer folder saved with save_pretrained or its tokenizer.json")
    from tokenizers import Tokenizer

    try:
        return file, Tokenizer.from_file(str(file)).get_vocab_size()
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise LoopDataError(f"{file}: cannot read the tokenizer ({e})") from None


def check_vocabulary(cfg: Config) -> None:
    """The tokenizer (and the one recorded next to each prefix) must fit model.vocab_size."""
    vocab = cfg.model.vocab_size
    sources: list[tuple[Path, int]] = []
    if cfg.data.tokenizer:
        found = _tokenizer_vocab(cfg.data.tokenizer)
        if found:
            sources.append(found)
    for prefix in [*cfg.data.train_prefixes, *(cfg.data.valid_prefixes or [])]:
        stats = Path(prefix + ".stats.json")
        if stats.is_file():
            try:
                size = json.loads(stats.read_text()).get("vocab_size")
            except json.JSONDecodeError:
                continue  # informational file; the indexed data itself is checked by the loader
            if isinstance(size, int):
                sources.append((stats, size))
    for where, size in sources:
        if size > vocab:
            raise LoopConfigError(
                f"{where}: tokenizer vocabulary of {size} tokens does not fit model.vocab_size={vocab}; "
                f"expected model.vocab_size >= {size}")


def check_output_dir(output_dir: Path, resume: bool) -> None:
    """A new or empty folder, or a run folder of ours when resuming; nothing else is touched."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise LoopConfigError(f"train.output_dir={str(output_dir)!r}: exists and is not a folder")
    entries = sorted(p.name for p in output_dir.iterdir() if p.name != LOCK_NAME)
    if not entries:  # nothing, or only the lock of a run starting now (the lock will name it)
        return
    ours = (output_dir / CHECKPOINTS).is_dir() or (output_dir / METRICS_NAME).is_file()
    if ours and resume:
        return
    if ours:
        raise LoopConfigError(
            f"train.output_dir={str(output_dir)!r}: exists and holds a previous run; set train.resume=true "
            "to continue it, or choose another train.output_dir")
    raise LoopConfigError(
        f"train.output_dir={str(output_dir)!r}: exists and is not empty (contains {entries[:3]}); "
        "expected a new folder or a run folder of pretrain_loop.py")


PROBE_BYTES = 1 << 20


def check_writable(output_dir: Path) -> None:
    """Rank 0, before the model is built: the files the run will append to and the folders it
    will write are writable, and a 1 MiB write fits (a full disk, a quota, a read-only mount is
    one clear error naming the file, not a traceback at the first log line or save)."""
    key = f"train.output_dir={str(output_dir)!r}"
    metrics = output_dir / METRICS_NAME
    targets = [output_dir] + [p for p in (output_dir / CHECKPOINTS,) if p.is_dir()]
    try:
        if metrics.exists():
            with metrics.open("a"):
                pass
    except OSError as e:
        raise LoopDataError(f"{metrics}: cannot be written ({os_error_text(e)}); the run appends its "
                            f"metrics there: make it writable or choose another train.output_dir") from None
    for folder in targets:
        probe = folder / f".write_probe.{os.getpid()}"
        try:
            with probe.open("wb") as f:
                f.write(b"\0" * PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise LoopDataError(f"{key}: cannot write in {folder} ({os_error_text(e)}); expected a writable "
                                "folder with free space") from None
        finally:
            try:
                probe.unlink(missing_ok=True)
            except OSError:
                pass
