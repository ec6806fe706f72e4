"""``manifest.json``: the size and sha256 of every file of a checkpoint, its step, and the settings
of the run that wrote it (the architecture, :func:`model_signature`, and what a resume compares,
:func:`megatron_loop.training.resume.run_settings`). Written last, before the publishing rename;
every reader verifies it before DeepSpeed reads a byte."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from megatron_loop.atomic import fsync_path, write_atomic
from megatron_loop.checkpoint.folders import MANIFEST
from megatron_loop.config import Config
from megatron_loop.errors import LoopDataError

FORMAT_VERSION = 1

# Model keys that change how the same weights are computed, not which weights exist: a run may
# resume with activation recomputation or compilation switched.
EXECUTION_KEYS = frozenset({"recompute", "recompute_budget_gib", "compile",
                            "recompute_selective_cost", "loss_implementation"})


def model_signature(cfg: Config) -> dict[str, Any]:
    """The architecture a checkpoint belongs to (the ``model:`` section without execution keys)."""
    return {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in EXECUTION_KEYS}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(tag_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Size and sha256 of every file under ``tag_dir`` (flushed to disk first), plus ``meta``."""
    files = {}
    for path in sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST):
        fsync_path(path)
        files[path.relative_to(tag_dir).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"format": FORMAT_VERSION, **meta, "files": files}
    write_atomic(tag_dir / MANIFEST, json.dumps(manifest, indent=1), durable=True)
    return manifest


def verify_checkpoint(tag_dir: Path) -> dict:
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
        if sha256_file(file) != entry["sha256"]:
            raise LoopDataError(f"{file}: sha256 differs from {path} (corrupt file)")
    return manifest
