"""The names inside a checkpoint folder (:mod:`megatron_loop.checkpoint` has the contract) and the
run config written next to the checkpoints."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from megatron_loop.atomic import write_atomic
from megatron_loop.config import Config, config_from_dict
from megatron_loop.errors import LoopDataError

CONFIG_NAME = "looplm_config.json"
MANIFEST = "manifest.json"
LATEST = "latest"
PARTIAL = ".partial"
SET_ASIDE = "set_aside"
TAG_PATTERN = re.compile(r"^global_step(\d+)$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def step_of(tag: str) -> int | None:
    m = TAG_PATTERN.match(tag)
    return int(m.group(1)) if m else None


def complete_tags(root: Path) -> list[tuple[int, str]]:
    """``(step, tag)`` of every published checkpoint folder under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = step_of(child.name)
        if step is not None and child.is_dir():
            found.append((step, child.name))
    return sorted(found, reverse=True)


def read_latest(root: Path) -> str | None:
    """The tag ``latest`` names (None: no file, or an empty one); :class:`LoopDataError` when it
    holds anything but a tag (bytes that are not text: a damaged file)."""
    latest = root / LATEST
    if not latest.is_file():
        return None
    raw = latest.read_bytes()
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        tag = None
    if tag is None or not all(c.isprintable() for c in tag):
        raise LoopDataError(f"{latest}: not a text file ({len(raw)} bytes, not a tag); expected the tag of a "
                            "checkpoint such as global_step30")
    return tag or None


# ----------------------------------------------------------------------------- run config


def save_run_config(directory: str | os.PathLike, cfg: Config) -> Path:
    """Write ``looplm_config.json`` atomically (temp file + rename)."""
    path = Path(directory) / CONFIG_NAME
    return write_atomic(path, json.dumps(cfg.to_dict(), indent=2))


def load_run_config(ckpt_dir: str | os.PathLike) -> Config:
    path = Path(ckpt_dir) / CONFIG_NAME
    if not Path(ckpt_dir).is_dir():
        raise LoopDataError(f"{ckpt_dir}: checkpoint folder not found")
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; expected the run config written next to the DeepSpeed checkpoint")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LoopDataError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(raw, source=str(path))
