"""The names inside a checkpoint folder (:mod:`megatron_loop.checkpoint` has the contract) and the
run config written next to the checkpoints."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from megatron_loop.atomic import write_atomic
from megatron_loop.config import Config, config_from_dict
from megatron_loop.config.paths import prefix_exists
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


# The run config's paths that tools read back from it (convert_to_hf.py: data.tokenizer); each is
# recorded absolute, and also relative to the config's folder when it lies in the run's folder.
RELOCATABLE = ("data.tokenizer", "data.train_prefixes", "data.valid_prefixes", "train.output_dir")
RELOCATION = "relocation"  # the JSON block: where the file was written, the relative spellings
RUN_NAMING = "run"  # the JSON block: the run's name and label as training states them (config/naming.py)


def run_folder(output_dir: str | os.PathLike) -> Path:
    """The folder a run's own files live in, which moves with it: the parent of its named folder
    (``runs/demo`` for ``runs/demo/model/train``, as tools/pipeline.sh lays out a demo: corpus,
    tokenizer, data and each model side by side)."""
    from megatron_loop.config.naming import named_folder

    return named_folder(output_dir).parent


def _paths(d: dict) -> dict[str, str]:
    """``key`` / ``key[i]`` -> the local path of each :data:`RELOCATABLE` value of a config dict."""
    out = {}
    for key in RELOCATABLE:
        section, name = key.split(".")
        value = d.get(section, {}).get(name)
        for i, v in ([(None, value)] if not isinstance(value, list) else list(enumerate(value))):
            if isinstance(v, str) and v:
                out[key if i is None else f"{key}[{i}]"] = v
    return out


def _present(path: Path) -> bool:
    """A file or folder, or an indexed-dataset prefix (P names P.bin / P.idx)."""
    return path.exists() or prefix_exists(path)


def _set_path(d: dict, key: str, value: str) -> None:
    name, _, index = key.partition("[")
    section, field = name.split(".")
    if index:
        d[section][field][int(index[:-1])] = value
    else:
        d[section][field] = value


def save_run_config(directory: str | os.PathLike, cfg: Config) -> Path:
    """Write ``looplm_config.json`` atomically (temp file + rename): the resolved config, its paths
    absolute, and a ``relocation`` block: the folder it was written in and, for each path inside
    the run's folder (:func:`run_folder`), its spelling relative to this file, so that a copied or
    moved run folder reads its own tokenizer and data (:func:`load_run_config`)."""
    path = Path(directory) / CONFIG_NAME
    d = cfg.to_dict()
    here, inside = Path(directory).resolve(), run_folder(cfg.train.output_dir)
    relative = {}
    for key, value in _paths(d).items():
        target = Path(value).expanduser().resolve()
        if _present(target) and target.is_relative_to(inside) and inside.parent != inside:  # not under "/"
            relative[key] = {"absolute": value, "relative": os.path.relpath(target, here)}
    d[RELOCATION] = {"written_in": str(here), "relative": relative}
    from megatron_loop.config.naming import run_label, run_name

    # what the run is called is decided from the YAML it came from, which this file no longer names: recorded
    d[RUN_NAMING] = {"name": run_name(cfg), "label": run_label(cfg)}
    return write_atomic(path, json.dumps(d, indent=2))


def recorded_run_name(ckpt_dir: str | os.PathLike) -> str:
    """The name the run that wrote ``ckpt_dir`` (a checkpoints/ folder or one tag in it) went by: as its run
    config records it, else (older checkpoints) its folder, NAME of runs/NAME/train/checkpoints."""
    from megatron_loop.config.naming import run_folder_name

    root = Path(ckpt_dir)
    if not (root / CONFIG_NAME).is_file() and (root.parent / CONFIG_NAME).is_file():  # a tag folder
        root = root.parent
    try:
        name = json.loads((root / CONFIG_NAME).read_text())[RUN_NAMING]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    return name if isinstance(name, str) and name else run_folder_name(root)


def _relocate(raw: dict, here: Path, path: Path) -> None:
    """Resolve the paths of a run config read from ``here``: unchanged where it was written; moved
    or copied, each path recorded relative to it is read from the new place when it is there, and
    every path read from outside the folder is named in one line (a copy would otherwise read the
    original's files without a word). A value edited by hand since (not the recorded one) wins."""
    block = raw.pop(RELOCATION, None)
    if not isinstance(block, dict) or Path(str(block.get("written_in"))) == here:
        return
    outside = []
    relative = block.get("relative") or {}
    for key, value in _paths(raw).items():
        spelled = relative.get(key) or {}
        rel = spelled.get("relative")
        if rel and spelled.get("absolute") == value and _present(here / rel):
            _set_path(raw, key, os.path.normpath(here / rel))
        elif key != "train.output_dir" and Path(value).is_absolute():
            outside.append(f"{key}={value}")
    if outside:
        print(f"note: {path}: written in {block['written_in']}, read from {here}; outside this run folder, read as "
              f"recorded: {', '.join(outside)}", file=sys.stderr, flush=True)


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
    if isinstance(raw, dict):
        raw.pop(RUN_NAMING, None)
        _relocate(raw, Path(ckpt_dir).resolve(), path)
    return config_from_dict(raw, source=str(path))
