"""Atomic, verified DeepSpeed checkpoints with exact-resume state (issue 5 item 5, issues 9, 16, 17).

Folder layout and how a checkpoint is chosen: :mod:`megatron_loop.model.io` (the reading side).

A save writes everything under ``<tag>.partial``, then rank 0 writes ``manifest.json`` (size and
sha256 of every file, the step, the settings of the run), renames the folder to ``<tag>`` and
only then replaces ``latest`` (temp file + ``os.replace``). A crash at any point leaves the
previous checkpoint published and loadable. Resume verifies the manifest before DeepSpeed reads
a byte; automatic resume follows ``latest`` and falls back to older checkpoints, an explicit
``--resume PATH`` fails with the name of the bad file.

A resume starts a branch: published checkpoints newer than the one resumed (a rollback with
``--resume``, a corrupt newer checkpoint, a save published just before a crash) are moved to
``set_aside/`` with the metrics they logged, so retention, ``latest`` and the metrics file only
ever see the branch being trained (:func:`set_aside_newer`).

Security (issue 9 item 6): our own files are read with ``torch.load(weights_only=True)`` and
DeepSpeed's loader is switched to ``weights_only=True`` with an allow-list of the few DeepSpeed
classes its optimizer state pickles (:func:`restrict_unpickling`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_loop.atomic import fsync_path, write_atomic
from megatron_loop.config import Config
from megatron_loop.errors import LoopDataError, first_line as _first_line, write_failure
from megatron_loop.model.io import (LATEST, MANIFEST, PARTIAL, SET_ASIDE, SelectedCheckpoint, complete_tags,
                                    read_latest, safe_load, save_run_config, select_automatic, select_explicit,
                                    sha256_file, tag_for, verify_checkpoint)
from megatron_loop.parallel.checkpoint import manifest_fields as tensor_parallel_fields
from megatron_loop.training import distributed as D

RNG_FILE = "rng_state_rank{rank}.pt"
FORMAT_VERSION = 1

__all__ = ["TrainState", "save_checkpoint", "load_checkpoint", "select_automatic", "select_explicit",
           "verify_checkpoint", "set_aside_newer", "prune", "model_signature", "EXECUTION_KEYS"]


@dataclass
class TrainState:
    """Loop counters saved as DeepSpeed ``client_state`` (data position for the sampler)."""

    step: int = 0  # global batches consumed (optimizer iterations, skipped ones included)
    consumed_samples: int = 0
    skipped_updates: int = 0  # non-finite steps whose update was skipped (issue 9 item 4)
    consecutive_nonfinite: int = 0

    def client_state(self) -> dict[str, int]:
        return {"looplm_train_state": dataclasses.asdict(self)}

    @classmethod
    def from_client_state(cls, client_state: dict, where: str) -> "TrainState":
        state = (client_state or {}).get("looplm_train_state")
        if not isinstance(state, dict):
            raise LoopDataError(f"{where}: no training state in the DeepSpeed client_state; "
                                "expected a checkpoint written by pretrain_loop.py")
        return cls(**{f.name: int(state[f.name]) for f in dataclasses.fields(cls)})


# ----------------------------------------------------------------------------- RNG state


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch RNG states as plain containers (loadable with weights_only=True)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(mt), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- files


def write_manifest(tag_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Size and sha256 of every file under ``tag_dir`` (flushed to disk first), plus ``meta``."""
    files = {}
    for path in sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        fsync_path(path)
        files[path.relative_to(tag_dir).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"format": FORMAT_VERSION, **meta, "files": files}
    write_atomic(tag_dir / MANIFEST, json.dumps(manifest, indent=1), durable=True)
    return manifest


# ----------------------------------------------------------------------------- save


def remove_partials(root: Path) -> None:
    """Leftovers of a save (or a universal conversion) that crashed before publishing."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.endswith(PARTIAL) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def publish(root: Path, partial: Path, tag: str) -> None:
    """Rename the verified folder to its tag, then point ``latest`` at it (the last write)."""
    final = root / tag
    if final.exists():  # re-saving a step after resuming from an earlier checkpoint
        old = root / (tag + ".replaced" + PARTIAL)
        os.replace(final, old)
        os.replace(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, final)
    fsync_path(root)
    write_atomic(root / LATEST, tag, durable=True)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete published checkpoints beyond the newest ``keep_last``; returns the removed tags.

    Only the branch being trained is in ``root``: newer checkpoints of an abandoned branch and
    corrupt ones skipped at resume were set aside (:func:`set_aside_newer`), so retention never
    deletes an older good checkpoint to keep a stale or corrupt newer one.
    """
    removed = []
    for _, tag in complete_tags(root)[keep_last:]:
        shutil.rmtree(root / tag, ignore_errors=True)
        removed.append(tag)
    return removed


# Model keys that change how the same weights are computed, not which weights exist: a run may
# resume with activation checkpointing or compilation switched.
EXECUTION_KEYS = frozenset({"activation_checkpointing", "activation_checkpointing_budget_gib", "compile",
                            "activation_checkpointing_selective_cost", "loss_implementation"})


def model_signature(cfg: Config) -> dict[str, Any]:
    """The architecture a checkpoint belongs to (the ``model:`` section without execution keys)."""
    return {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in EXECUTION_KEYS}


def save_checkpoint(engine, root: Path, state: TrainState, cfg: Config, info: D.DistInfo,
                    settings: dict[str, Any]) -> str:
    """Atomically save ``engine`` + ``state`` + RNG as ``global_step{state.step}``; returns the tag.

    ``settings`` (:func:`megatron_loop.training.resume.run_settings`) go into the manifest: what a
    resume compares with its new config. A write failure on any rank (full disk, quota, I/O
    error) removes the partial folder and raises :class:`LoopDataError` naming the condition;
    the previous checkpoint stays published.
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
        try:
            engine.save_checkpoint(str(root), tag=partial.name, client_state=state.client_state(),
                                   save_latest=False)
            torch.save(capture_rng(), partial / RNG_FILE.format(rank=info.rank))
        except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as RuntimeError
            error = f"rank {info.rank}: {write_failure(e, partial if partial.is_dir() else root)}"
    failed = D.all_reduce_max([1.0 if error else 0.0])[0] > 0
    publish_error = None
    if not failed and info.is_main:
        try:
            write_manifest(partial, {"tag": tag, "step": state.step, "consumed_samples": state.consumed_samples,
                                     "model": model_signature(cfg), **settings,
                                     **tensor_parallel_fields(engine.module)})
            publish(root, partial, tag)
            save_run_config(root, cfg)
        except OSError as e:
            publish_error = f"rank 0: {write_failure(e, root)}"
    publish_error = D.broadcast_object(publish_error)
    if failed or publish_error:
        if info.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        previous = read_latest(root) if root.is_dir() else None
        reason = error or publish_error or "on another rank"
        raise LoopDataError(f"{partial}: writing the checkpoint failed ({reason}); nothing was "
                            f"published, the latest checkpoint is still {previous or 'none'}")
    if info.is_main:
        prune(root, cfg.train.keep_last)
    D.barrier()
    return tag


# ----------------------------------------------------------------------------- resume


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
        dest = root / SET_ASIDE / f"{time.strftime('%Y%m%d-%H%M%S')}-resumed-{point.tag}"
        dest.mkdir(parents=True, exist_ok=True)
        for tag in newer:
            os.replace(root / tag, dest / tag)
        if metrics is not None and metrics.is_file():
            dropped = [line for line in metrics.read_text().splitlines() if _record_step(line) > step]
            write_atomic(dest / metrics.name, "".join(line + "\n" for line in dropped))
        fsync_path(root)
    if outside:  # the branch point becomes this folder's: an automatic restart resumes this lineage
        adopt_checkpoint(point, root)
    if read_latest(root) != point.tag:
        write_atomic(root / LATEST, point.tag, durable=True)
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link (free on the same file system; published checkpoints are never modified in place,
    only renamed or removed), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def adopt_checkpoint(point: SelectedCheckpoint, root: Path) -> None:
    """Publish the checkpoint ``point`` of another folder in ``root`` under its tag (through a
    ``.partial`` folder and a rename, as a save)."""
    partial = root / (point.tag + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(point.path, partial, copy_function=_link_or_copy)
    os.replace(partial, root / point.tag)
    fsync_path(root)


def _record_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
        return 0


def restrict_unpickling(engine) -> None:
    """Make DeepSpeed's checkpoint reader use ``torch.load(weights_only=True)`` (it defaults to
    False): only tensors, containers and an allow-list of DeepSpeed's own classes unpickle."""
    engine.checkpoint_engine.load = lambda path, map_location=None: safe_load(path, map_location)


def load_checkpoint(engine, point: SelectedCheckpoint, info: D.DistInfo,
                    load_dir: Path | None = None) -> TrainState:
    """Restore model, optimizer (Muon momentum, AdamW moments), scheduler, loop state and RNG.

    ``load_dir``: where DeepSpeed reads ``point.tag`` from (a universal conversion of it,
    :mod:`megatron_loop.training.universal`); the RNG states always come from ``point``.
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
