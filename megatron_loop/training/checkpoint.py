"""Atomic, verified DeepSpeed checkpoints with exact-resume state (issue 5 item 5, issue 9 item 2).

Folder layout (``{output_dir}/checkpoints``, the contract of :mod:`megatron_loop.model.io`)::

    latest                         tag of the newest published checkpoint (DeepSpeed's convention)
    looplm_config.json             the run config (load_model_from_checkpoint, convert_to_hf)
    global_step{N}/                DeepSpeed shards + rng_state_rank{r}.pt + manifest.json
    global_step{N}.partial/        a save in progress (never loaded, removed on the next start)

A save writes everything under ``<tag>.partial``, then rank 0 writes ``manifest.json`` (size and
sha256 of every file, the step, the model architecture), renames the folder to ``<tag>`` and
only then replaces ``latest`` (temp file + ``os.replace``). A crash at any point leaves the
previous checkpoint published and loadable. Resume verifies the manifest before DeepSpeed reads
a byte; automatic resume walks from the newest complete checkpoint to older ones, an explicit
``--resume PATH`` fails with the name of the bad file.

Security (issue 9 item 6): our own files are read with ``torch.load(weights_only=True)`` and
DeepSpeed's loader is switched to ``weights_only=True`` with an allow-list of the few DeepSpeed
classes its optimizer state pickles (:func:`restrict_unpickling`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_loop.config import Config
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.model.io import save_run_config
from megatron_loop.training import distributed as D

MANIFEST = "manifest.json"
LATEST = "latest"
PARTIAL = ".partial"
TAG_PATTERN = re.compile(r"^global_step(\d+)$")
RNG_FILE = "rng_state_rank{rank}.pt"
FORMAT_VERSION = 1


def tag_for(step: int) -> str:
    return f"global_step{step}"


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


# ----------------------------------------------------------------------------- manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(tag_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Size and sha256 of every file under ``tag_dir`` (flushed to disk first), plus ``meta``."""
    files = {}
    for path in sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        _fsync(path)
        files[path.relative_to(tag_dir).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"format": FORMAT_VERSION, **meta, "files": files}
    _write_atomic(tag_dir / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def verify_checkpoint(tag_dir: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint; a :class:`LoopDataError` naming the bad file otherwise."""
    path = tag_dir / MANIFEST
    if not tag_dir.is_dir():
        raise LoopDataError(f"{tag_dir}: checkpoint folder not found")
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; the checkpoint is incomplete (interrupted save) "
                            "or was not written by pretrain_loop.py")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise LoopDataError(f"{path}: unreadable manifest ({e})") from None
    for name, entry in files.items():
        file = tag_dir / name
        if not file.is_file():
            raise LoopDataError(f"{file}: missing; the manifest lists it ({entry['size']} bytes)")
        size = file.stat().st_size
        if size != entry["size"]:
            raise LoopDataError(f"{file}: {size} bytes, expected {entry['size']} from {path} "
                                "(truncated or partially written)")
        if _sha256(file) != entry["sha256"]:
            raise LoopDataError(f"{file}: sha256 differs from {path} (corrupt file)")
    return manifest


def _first_line(error: BaseException) -> str:
    """Errors are reported on one line (the CLI prints exactly one ``error:`` line)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


# ----------------------------------------------------------------------------- save


def complete_tags(root: Path) -> list[tuple[int, str]]:
    """``(step, tag)`` of every published checkpoint folder under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = TAG_PATTERN.match(child.name)
        if m and child.is_dir():
            found.append((int(m.group(1)), child.name))
    return sorted(found, reverse=True)


def remove_partials(root: Path) -> None:
    """Leftovers of a save that crashed before publishing (never loadable by construction)."""
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
    _fsync(root)
    _write_atomic(root / LATEST, tag)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete published checkpoints beyond the newest ``keep_last``; returns the removed tags."""
    removed = []
    for _, tag in complete_tags(root)[keep_last:]:
        shutil.rmtree(root / tag, ignore_errors=True)
        removed.append(tag)
    return removed


# Model keys that change how the same weights are computed, not which weights exist: a run may
# resume with activation checkpointing or compilation switched.
EXECUTION_KEYS = frozenset({"activation_checkpointing", "activation_checkpointing_budget_gib", "compile",
                            "loss_implementation"})


def model_signature(cfg: Config) -> dict[str, Any]:
    """The architecture a checkpoint belongs to (the ``model:`` section without execution keys)."""
    return {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in EXECUTION_KEYS}


def save_checkpoint(engine, root: Path, state: TrainState, cfg: Config, info: D.DistInfo,
                    zero_stage: int) -> str:
    """Atomically save ``engine`` + ``state`` + RNG as ``global_step{state.step}``; returns the tag.

    A write failure on any rank (full disk, quota, I/O error) removes the partial folder and
    raises :class:`LoopDataError`; the previous checkpoint stays published.
    """
    tag = tag_for(state.step)
    partial = root / (tag + PARTIAL)
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
    D.barrier()
    error = None
    try:
        engine.save_checkpoint(str(root), tag=partial.name, client_state=state.client_state(),
                               save_latest=False)
        torch.save(capture_rng(), partial / RNG_FILE.format(rank=info.rank))
    except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as RuntimeError
        error = f"rank {info.rank}: {_first_line(e)}"
    failed = D.all_reduce_max([1.0 if error else 0.0])[0] > 0
    publish_error = None
    if not failed and info.is_main:
        try:
            write_manifest(partial, {
                "tag": tag, "step": state.step, "consumed_samples": state.consumed_samples,
                "world_size": info.world_size, "zero_stage": zero_stage, "model": model_signature(cfg)})
            publish(root, partial, tag)
            save_run_config(root, cfg)
        except OSError as e:
            publish_error = f"rank 0: {_first_line(e)}"
    publish_error = D.broadcast_object(publish_error)
    if failed or publish_error:
        if info.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        latest = root / LATEST
        previous = latest.read_text().strip() if latest.is_file() else "none"
        reason = error or publish_error or "on another rank"
        raise LoopDataError(f"{partial}: writing the checkpoint failed ({reason}); nothing was "
                            f"published, the latest checkpoint is still {previous}")
    if info.is_main:
        prune(root, cfg.train.keep_last)
    D.barrier()
    return tag


# ----------------------------------------------------------------------------- resume


@dataclass(frozen=True)
class ResumePoint:
    root: Path
    tag: str
    manifest: dict
    notes: tuple[str, ...] = ()  # checkpoints skipped on the way (automatic fallback)


def _split_path(path: Path) -> tuple[Path, str | None]:
    """``--resume`` accepts a checkpoint root (uses ``latest``) or one tag folder."""
    if (path / MANIFEST).is_file() or TAG_PATTERN.match(path.name) or path.name.endswith(PARTIAL):
        return path.parent, path.name
    return path, None


def select_explicit(path: Path) -> ResumePoint:
    """``--resume PATH``: exactly that checkpoint (or the one ``latest`` names); errors, no fallback."""
    if not path.exists():
        raise LoopDataError(f"--resume {path}: not found; expected a checkpoint folder "
                            "(the run's checkpoints/ folder or one global_step* folder in it)")
    root, tag = _split_path(path)
    if tag is not None and tag.endswith(PARTIAL):
        raise LoopDataError(f"{path}: an unpublished save (interrupted before '{LATEST}' was updated); "
                            "expected a published checkpoint folder such as global_step<N>")
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            raise LoopDataError(f"{latest}: missing; expected the tag of the checkpoint to resume from")
        tag = latest.read_text().strip()
    return ResumePoint(root, tag, verify_checkpoint(root / tag))


def select_automatic(root: Path) -> ResumePoint | None:
    """The newest checkpoint under ``root`` whose manifest verifies; None when there is none.

    A corrupt or partial newer checkpoint is reported and skipped; when checkpoints exist but
    none verifies, that is an error (starting over would silently discard a run).
    """
    notes = []
    for _, tag in complete_tags(root):
        try:
            return ResumePoint(root, tag, verify_checkpoint(root / tag), tuple(notes))
        except LoopDataError as e:
            notes.append(f"skipping checkpoint {tag}: {e}")
    if notes:
        raise LoopDataError(f"{root}: no loadable checkpoint; " + "; ".join(notes))
    return None


def check_compatible(point: ResumePoint, cfg: Config, info: D.DistInfo) -> None:
    """Refuse a checkpoint of another architecture or data-parallel size before DeepSpeed reads it."""
    where = point.root / point.tag / MANIFEST
    saved = point.manifest.get("model", {})
    current = model_signature(cfg)
    for key in current:
        if saved.get(key) != current[key]:
            raise LoopConfigError(
                f"{where}: checkpoint is for a different architecture: model.{key}={saved.get(key)!r} "
                f"in the checkpoint, {current[key]!r} in the config")
    if point.manifest.get("zero_stage", 0) >= 1 and point.manifest.get("world_size") != info.world_size:
        raise LoopConfigError(
            f"{where}: written by {point.manifest.get('world_size')} data-parallel ranks, resumed with "
            f"{info.world_size}; ZeRO optimizer partitions need the same number of ranks")


_SAFE_DEEPSPEED_GLOBALS: list | None = None


def deepspeed_safe_globals() -> list:
    """Classes DeepSpeed pickles into its checkpoints besides tensors and containers."""
    global _SAFE_DEEPSPEED_GLOBALS
    if _SAFE_DEEPSPEED_GLOBALS is None:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        from megatron_loop.optim.schedule import WSDMultiplier

        _SAFE_DEEPSPEED_GLOBALS = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address,
                                   WSDMultiplier, set]
    return _SAFE_DEEPSPEED_GLOBALS


def restrict_unpickling(engine) -> None:
    """Make DeepSpeed's checkpoint reader use ``torch.load(weights_only=True)`` (it defaults to
    False): only tensors, containers and an allow-list of DeepSpeed's own classes unpickle."""
    ckpt_engine = engine.checkpoint_engine

    def load(path, map_location=None):
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)

    ckpt_engine.load = load


def load_checkpoint(engine, point: ResumePoint, info: D.DistInfo) -> TrainState:
    """Restore model, optimizer (Muon momentum, AdamW moments), scheduler, loop state and RNG."""
    restrict_unpickling(engine)
    where = point.root / point.tag
    try:
        path, client_state = engine.load_checkpoint(str(point.root), tag=point.tag, load_optimizer_states=True,
                                                    load_lr_scheduler_states=True)
    except (RuntimeError, KeyError, ValueError, OSError, EOFError, torch.serialization.pickle.UnpicklingError) as e:
        raise LoopDataError(f"{where}: DeepSpeed could not load the checkpoint "
                            f"({type(e).__name__}: {_first_line(e)})") from None
    if path is None:
        raise LoopDataError(f"{where}: DeepSpeed found no checkpoint to load")
    state = TrainState.from_client_state(client_state, str(where))
    rng_path = where / RNG_FILE.format(rank=info.rank)
    try:
        restore_rng(torch.load(rng_path, weights_only=True))
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        raise LoopDataError(f"{rng_path}: cannot restore the RNG state ({_first_line(e)})") from None
    return state
