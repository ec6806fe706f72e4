"""Saving and restoring a run through DeepSpeed's engine, on every rank, in the on-disk format of
:mod:`megatron_loop.checkpoint` (folder layout, manifest, publishing, which checkpoint to read).

A save writes everything under ``<tag>.partial`` on every rank, then rank 0 writes
``manifest.json`` (size and sha256 of every file, the step, the settings of the run), renames the
folder to ``<tag>`` and only then replaces ``latest``. A crash at any point leaves the previous
checkpoint published and loadable. Resume verifies the manifest before DeepSpeed reads a byte;
automatic resume follows ``latest`` and falls back to older checkpoints, an explicit
``--resume PATH`` fails with the name of the bad file.

A resume starts a branch: published checkpoints newer than the one resumed (a rollback with
``--resume``, a corrupt newer checkpoint, a save published just before a crash) are moved to
``set_aside/`` with the metrics they logged, so retention, ``latest`` and the metrics file only
ever see the branch being trained (:func:`set_aside_newer`).

The resume itself is orchestrated here too, rank 0 deciding and every rank following
(``distributed.on_main``): which checkpoint (:func:`choose_resume_point`), the branch
(:func:`start_branch`), a universal copy for another number of data-parallel ranks
(:func:`universal_copy`) and what the log says about it (:func:`resume_messages`); what changed
since the checkpoint is decided by :mod:`megatron_loop.training.resume`.

DeepSpeed's loader is switched to ``torch.load(weights_only=True)`` with an allow-list of the few
DeepSpeed classes its optimizer state pickles
(:func:`megatron_loop.checkpoint.weights.restrict_unpickling`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from megatron_loop.atomic import fsync_path, write_atomic
from megatron_loop.checkpoint.folders import (LATEST, PARTIAL, SET_ASIDE, complete_tags, read_latest, save_run_config,
                                             tag_for)
from megatron_loop.checkpoint.manifest import model_signature, write_manifest
from megatron_loop.checkpoint.publish import adopt_checkpoint, prune, publish, remove_partials
from megatron_loop.checkpoint.selection import SelectedCheckpoint, select_automatic, select_explicit
from megatron_loop.checkpoint.state import RNG_FILE, TrainState, capture_rng, restore_rng
from megatron_loop.checkpoint.tensor_parallel import manifest_fields as tensor_parallel_fields
from megatron_loop.checkpoint.universal import to_universal
from megatron_loop.checkpoint.weights import restrict_unpickling, safe_load
from megatron_loop.config import Config
from megatron_loop.errors import LoopDataError, first_line as _first_line, write_failure
from megatron_loop.training import distributed as D
from megatron_loop.training.metrics import METRICS_NAME, read_records, record_step
from megatron_loop.training.resume import ResumeDecision

# The training loop reaches the format's selection and clean-up through this module.
__all__ = ["save_checkpoint", "load_checkpoint", "set_aside_newer", "choose_resume_point", "start_branch",
           "universal_copy", "resume_messages"]


def save_checkpoint(engine, root: Path, state: TrainState, cfg: Config, info: D.DistInfo,
                    settings: dict[str, Any], retention: bool = True) -> str:
    """Atomically save ``engine`` + ``state`` + RNG as ``global_step{state.step}``; returns the tag.

    ``settings`` (:func:`megatron_loop.training.resume.run_settings`) go into the manifest: what a
    resume compares with its new config. A write failure on any rank (full disk, quota, file-size
    limit, read-only mount, I/O error) does not interrupt DeepSpeed's save on that rank
    (:func:`_write_failures_deferred`): every rank goes through the save's collectives as the
    others do, then one exchange tells every rank which rank failed on which file and why; the
    partial folder is removed and every rank raises the same :class:`LoopDataError`. The
    previous checkpoint stays published. ``retention`` False: no older checkpoint is removed (a save
    during a streak of skipped updates keeps the newest one from before it, training/loop.py).
    """
    tag = tag_for(state.step)
    partial = root / (tag + PARTIAL)
    error = None
    if info.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
        except OSError as e:
            error = f"rank 0: {write_failure(e, root)}"
    D.barrier()
    if error is None:
        with _write_failures_deferred(engine) as failures:
            try:
                engine.save_checkpoint(str(root), tag=partial.name, client_state=state.client_state(),
                                       save_latest=False)
            except OSError as e:  # a write of DeepSpeed's own, outside its checkpoint engine (a folder)
                failures.append((Path(e.filename or partial), e))
        if not failures:
            rng_file = partial / RNG_FILE.format(rank=info.rank)
            try:
                torch.save(capture_rng(), rng_file)
            except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as RuntimeError
                failures.append((rng_file, e))
        if failures:
            path, e = failures[0]
            error = f"rank {info.rank}: {write_failure(e, path.parent if path.parent.is_dir() else root)}"
            if str(path) not in error:
                error += f" (writing {path})"
    # The save's one exchange: every rank learns at once whether, where and why another failed.
    errors = [e for e in D.all_gather_object(error) if e]
    publish_error = None
    if not errors and info.is_main:
        try:
            write_manifest(partial, {"tag": tag, "step": state.step, "consumed_samples": state.consumed_samples,
                                     "model": model_signature(cfg), **settings,
                                     **tensor_parallel_fields(engine.module, engine.module.tensor_parallel.placement)})
            publish(root, partial, tag)
            save_run_config(root, cfg)
        except OSError as e:
            publish_error = f"rank 0: {write_failure(e, root)}"
    publish_error = D.broadcast_object(publish_error)
    if errors or publish_error:
        if info.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        D.barrier()  # the same answer on every rank: read after rank 0 cleaned up
        previous = _latest_or_none(root)
        reason = "; ".join(errors) if errors else publish_error
        raise LoopDataError(f"{partial}: writing the checkpoint failed ({reason}); nothing was "
                            f"published, the latest checkpoint is still {previous or 'none'}")
    if info.is_main and retention:
        prune(root, cfg.train.keep_last)
    D.barrier()
    return tag


@contextmanager
def _write_failures_deferred(engine) -> Iterator[list[tuple[Path, BaseException]]]:
    """While DeepSpeed saves: a file its checkpoint engine fails to write (``OSError``, or torch's
    zip writer's ``RuntimeError`` on a full disk) is recorded in the yielded list instead of
    raised, and the rank's later files are skipped. Raised, the error would leave this rank out of
    the collectives DeepSpeed runs during and after the writes (ZeRO-3's gathers, its final
    barrier) while the other ranks wait there: the job would hang for ``collective_timeout_s``
    and end with an unrelated timeout instead of the real cause."""
    ckpt_engine = engine.checkpoint_engine
    save = ckpt_engine.save
    failures: list[tuple[Path, BaseException]] = []

    def deferred(state_dict, path, *args, **kwargs):
        if failures:
            return None
        try:
            return save(state_dict, path, *args, **kwargs)
        except (OSError, RuntimeError) as e:
            failures.append((Path(path), e))
            return None

    ckpt_engine.save = deferred
    try:
        yield failures
    finally:
        del ckpt_engine.save  # the instance attribute: the class's method again


def _latest_or_none(root: Path) -> str | None:
    """The tag ``latest`` names, for messages; a damaged pointer is reported as such, not raised."""
    try:
        return read_latest(root) if root.is_dir() else None
    except LoopDataError:
        return "unreadable (a damaged 'latest')"


def set_aside_newer(root: Path, point: SelectedCheckpoint, metrics: Path | None) -> Path | None:
    """Start a branch at ``point``: move every published checkpoint of ``root`` newer than it, and
    the metrics records logged after it, to ``root/set_aside/<time>-resumed-<tag>/`` (nothing is
    deleted), and make ``latest`` follow the branch. Returns that folder (None: nothing newer)."""
    step = point.step or 0
    outside = point.root.resolve() != root.resolve()
    # From another run's folder: a local checkpoint of the same step belongs to another lineage too.
    newer = [tag for s, tag in complete_tags(root) if s > step or (outside and s == step)]
    dest = None
    if newer:
        dest = _new_set_aside_folder(root / SET_ASIDE, f"{time.strftime('%Y%m%d-%H%M%S')}-resumed-{point.tag}")
        for tag in newer:
            os.replace(root / tag, dest / tag)
        if metrics is not None and metrics.is_file():
            dropped = [line for line, record in read_records(metrics) if record_step(record) > step]
            write_atomic(dest / metrics.name, "".join(line + "\n" for line in dropped))
        fsync_path(root)
    if outside:  # the branch point becomes this folder's: an automatic restart resumes this lineage
        adopt_checkpoint(point.path, root)
    try:
        current = read_latest(root)
    except LoopDataError:  # a damaged pointer, already skipped by the choice of ``point``: replaced
        current = None
    if current != point.tag:
        write_atomic(root / LATEST, point.tag, durable=True)
    return dest


def _new_set_aside_folder(parent: Path, name: str) -> Path:
    """A new folder ``parent/name``, or ``name-2``, ``name-3``, ... when a branch was already set
    aside under that name (two rollbacks to one step within a second, or a clock that stood still):
    a second branch never merges into, or fails on, the first one's folder."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        dest = parent / (name if n == 1 else f"{name}-{n}")
        try:
            dest.mkdir()
            return dest
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def load_checkpoint(engine, point: SelectedCheckpoint, info: D.DistInfo,
                    load_dir: Path | None = None) -> TrainState:
    """Restore model, optimizer (Muon momentum, AdamW moments), scheduler, loop state and RNG.

    ``load_dir``: where DeepSpeed reads ``point.tag`` from (a universal conversion of it,
    :mod:`megatron_loop.checkpoint.universal`); the RNG states always come from ``point``.
    """
    restrict_unpickling(engine)
    where = point.path
    try:
        path, client_state = engine.load_checkpoint(str(load_dir or point.root), tag=point.tag,
                                                    load_optimizer_states=True, load_lr_scheduler_states=True)
    except (RuntimeError, KeyError, ValueError, OSError, EOFError, AssertionError,
            torch.serialization.pickle.UnpicklingError) as e:
        raise LoopDataError(f"{where}: DeepSpeed could not load the checkpoint "
                            f"({type(e).__name__}: {_first_line(e)})") from None
    if path is None:
        raise LoopDataError(f"{where}: DeepSpeed found no checkpoint to load")
    state = TrainState.from_client_state(client_state, str(where))
    rng_path = where / RNG_FILE.format(rank=info.rank)
    if not rng_path.is_file():  # more ranks than the checkpoint had: rank 0's generators
        rng_path = where / RNG_FILE.format(rank=0)
    try:
        restore_rng(safe_load(rng_path))
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        raise LoopDataError(f"{rng_path}: cannot restore the RNG state ({_first_line(e)})") from None
    return state


# ----------------------------------------------------------------------------- resume orchestration


def choose_resume_point(root: Path, resume: str | None, auto: bool, info: D.DistInfo) -> SelectedCheckpoint | None:
    """``--resume PATH`` (strict) or the checkpoint ``latest`` names under ``root`` (with fallback).

    Rank 0 reads and verifies the manifests, every rank follows its decision (or its error).
    """
    def choose() -> SelectedCheckpoint | None:
        if resume is not None:
            return select_explicit(Path(resume))
        remove_partials(root)
        return select_automatic(root) if auto else None

    return D.on_main(info, choose, share=True)


def start_branch(root: Path, point: SelectedCheckpoint, out: Path, info: D.DistInfo) -> Path | None:
    """Rank 0 moves checkpoints newer than ``point`` (and their metrics) aside (:func:`set_aside_newer`)."""
    return D.on_main(info, lambda: set_aside_newer(root, point, out / METRICS_NAME), share=True)


def universal_copy(root: Path, point: SelectedCheckpoint, info: D.DistInfo) -> Path:
    """Rank 0 writes ``point`` in DeepSpeed's universal layout next to it (a ``.partial`` folder:
    removed after loading, and by the next start if the run dies first)."""
    load_dir = root / f"{point.tag}.universal{PARTIAL}"

    def convert() -> Path:
        shutil.rmtree(load_dir, ignore_errors=True)
        try:
            to_universal(point.path, load_dir)
        except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as a RuntimeError
            why = write_failure(e, root)  # before the clean-up: the probe write needs the disk as it was
            shutil.rmtree(load_dir, ignore_errors=True)  # not left filling the disk until the next start
            raise LoopDataError(f"{load_dir}: writing the universal checkpoint failed ({why}); removed it, "
                                f"{point.path} is unchanged") from None
        except BaseException:
            shutil.rmtree(load_dir, ignore_errors=True)
            raise
        return load_dir

    return D.on_main(info, convert, share=True)


def resume_messages(point: SelectedCheckpoint, decision: ResumeDecision, set_aside: Path | None,
                    schedule_line: str | None, state: TrainState, info: D.DistInfo, resume: str | None,
                    total_steps: int) -> list[str]:
    """What the log says about a resume: skipped checkpoints, the branch, what changed, where it starts."""
    msgs = list(point.notes)
    if set_aside is not None:
        msgs.append(f"starting a new branch at {point.tag}: newer checkpoints and their metrics moved to {set_aside}")
    msgs += decision.summary(point.manifest.get("world_size") if point.manifest else None, info.world_size)
    msgs += [schedule_line] if schedule_line else []
    how = "--resume" if resume is not None else "newest complete checkpoint"
    msgs.append(f"resuming from {point.path} (step {state.step}, {state.consumed_samples} samples consumed; {how})")
    if state.step >= total_steps:
        msgs.append(f"nothing left to train: the checkpoint is at step {state.step} and the config asks for "
                    f"{total_steps} steps")
    return msgs
