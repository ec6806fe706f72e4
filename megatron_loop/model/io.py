"""Reading a trained LoopLM back from a DeepSpeed checkpoint folder (any ZeRO stage).

Checkpoint folder contract (written by :mod:`megatron_loop.training.checkpoint`)::

    CKPT_DIR/latest                 tag of the newest published checkpoint (DeepSpeed's convention)
    CKPT_DIR/looplm_config.json     the resolved run config (``Config.to_dict()``)
    CKPT_DIR/global_step{N}/        DeepSpeed shards + rng_state_rank{r}.pt + manifest.json
    CKPT_DIR/global_step{N}.partial a save in progress (never read)
    CKPT_DIR/set_aside/...          checkpoints of an abandoned branch or that failed verification

``manifest.json`` lists the size and sha256 of every file of its checkpoint. Everything that
reads a checkpoint (resume, ``convert_to_hf.py``, ``probe_geometry.py``) picks it the same way
(:func:`select_checkpoint`): the tag ``latest`` names, verified against its manifest, falling back
to the newest older one that verifies; a checkpoint named explicitly is verified and refused
with the name of the bad file. A DeepSpeed folder without any manifest (written by another
tool) is read as is, with a note that it could not be verified.

Weights are consolidated with DeepSpeed's own ``zero_to_fp32`` utilities, which handle ZeRO 1/2
flat partitions and ZeRO 3 parameter shards alike. Every ``torch.load`` here is weights-only
(tensors, containers and an allow-list of DeepSpeed's checkpoint classes).

This module imports nothing from :mod:`megatron_loop.training` (the writer imports the reader).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

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


# ----------------------------------------------------------------------------- manifest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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


# ----------------------------------------------------------------------------- which checkpoint


@dataclass(frozen=True)
class SelectedCheckpoint:
    """One checkpoint to read: ``root / tag``, its verified manifest (None for a folder written by
    another tool), the checkpoints skipped on the way (``skipped``: tag -> why) and the published
    checkpoints newer than it that are not on the branch ``latest`` follows (``newer``)."""

    root: Path
    tag: str
    manifest: dict | None
    skipped: tuple[tuple[str, str], ...] = ()
    newer: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return self.root / self.tag

    @property
    def step(self) -> int | None:
        return (self.manifest or {}).get("step", step_of(self.tag))

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(f"skipping checkpoint {tag}: {why}" for tag, why in self.skipped)


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


def split_checkpoint_path(path: Path) -> tuple[Path, str | None]:
    """A checkpoint root (``latest`` decides) or one tag folder in it."""
    if (path / MANIFEST).is_file() or step_of(path.name) is not None or path.name.endswith(PARTIAL):
        return path.parent, path.name
    return path, None


def select_explicit(path: Path) -> SelectedCheckpoint:
    """Exactly the checkpoint at ``path`` (or the one its ``latest`` names), verified; no fallback."""
    if not path.exists():
        raise LoopDataError(f"--resume {path}: not found; expected a checkpoint folder "
                            "(the run's checkpoints/ folder or one global_step* folder in it)")
    root, tag = split_checkpoint_path(path)
    if tag is not None and tag.endswith(PARTIAL):
        raise LoopDataError(f"{path}: an unpublished save (interrupted before '{LATEST}' was updated); "
                            "expected a published checkpoint folder such as global_step<N>")
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            raise LoopDataError(f"{root / LATEST}: missing; expected the tag of the checkpoint to resume from")
    return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag))


def select_automatic(root: Path) -> SelectedCheckpoint | None:
    """The checkpoint ``latest`` names if its manifest verifies, else the newest older one that does;
    None when ``root`` holds no checkpoint.

    ``latest`` decides, not the highest step number: after a rollback the newer checkpoints of the
    abandoned branch are not resumed (they are reported in ``newer``). A corrupt or missing
    checkpoint is skipped with the reason; when checkpoints exist but none verifies, that is an
    error (starting over would silently discard a run).
    """
    tags = complete_tags(root)
    skipped: list[tuple[str, str]] = []
    try:
        latest = read_latest(root)
    except LoopDataError as e:  # a damaged pointer: fall back to the newest complete checkpoint
        latest = None
        skipped.append((LATEST, str(e)))
    latest_step = step_of(latest) if latest else None
    newer: list[str] = []
    if latest_step is not None and not (root / latest).is_dir():
        skipped.append((latest, f"{root / latest}: named by '{LATEST}' but missing"))
    for step, tag in tags:
        if latest_step is not None and step > latest_step:
            newer.append(tag)  # not on the branch 'latest' follows
            continue
        try:
            return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag), tuple(skipped), tuple(newer))
        except LoopDataError as e:
            skipped.append((tag, str(e)))
    if skipped:
        raise LoopDataError(f"{root}: no loadable checkpoint; "
                            + "; ".join(f"skipping checkpoint {tag}: {why}" for tag, why in skipped))
    return None


def select_checkpoint(path: str | os.PathLike, tag: str | None = None) -> SelectedCheckpoint:
    """What an export or a probe reads from ``path`` (a checkpoint root or one tag folder in it).

    As training resumes: a named tag (``--tag`` or a tag folder) is verified and refused when
    damaged; otherwise ``latest`` with fallback to the newest complete checkpoint. A folder
    without any manifest (a DeepSpeed checkpoint written by another tool) is read unverified.
    """
    path = Path(path)
    if not path.is_dir():
        raise LoopDataError(f"{path}: checkpoint folder not found")
    root, named = split_checkpoint_path(path)
    tag = tag or named
    if tag is not None:
        if tag.endswith(PARTIAL):
            raise LoopDataError(f"{root / tag}: an unpublished save (interrupted); expected a published "
                                "checkpoint folder such as global_step<N>")
        if (root / tag / MANIFEST).is_file() or step_of(tag) is not None:
            return SelectedCheckpoint(root, tag, verify_checkpoint(root / tag))
        if not (root / tag).is_dir():
            raise LoopDataError(f"{root / tag}: checkpoint tag folder not found")
        return SelectedCheckpoint(root, tag, None)
    chosen = select_automatic(root)
    if chosen is not None:
        return chosen
    latest = read_latest(root)  # no global_step* folder: a DeepSpeed folder of another tool
    if latest is None:
        raise LoopDataError(f"{root / LATEST}: missing; expected DeepSpeed's 'latest' tag file (or pass a tag)")
    if not (root / latest).is_dir():
        raise LoopDataError(f"{root / latest}: checkpoint tag folder not found")
    return SelectedCheckpoint(root, latest, None)


# ----------------------------------------------------------------------------- weights-only loading


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


def safe_load(path, map_location=None):
    """``torch.load`` with ``weights_only=True``: only tensors, containers and the allow-list of
    DeepSpeed's own checkpoint classes unpickle; a checkpoint carrying code does not run."""
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


class _WeightsOnlyTorch:
    """``torch`` as DeepSpeed's ``zero_to_fp32`` sees it, except that ``torch.load`` unpickles with
    ``weights_only=True`` (zero_to_fp32 hard-codes False) and a bf16 ZeRO 1 shard reads as ZeRO 1.

    bf16 runs at ZeRO 1 train with DeepSpeed's BF16_Optimizer (fp32 gradient accumulation,
    :mod:`megatron_loop.optim.engine`), whose ``bf16_zero_pp_rank_*`` shards carry no
    ``zero_stage``, so zero_to_fp32 calls them "not a zero checkpoint"; their fp32 partitions are
    laid out as ZeRO 1's (each group's weights back to back, padding at the end, equal parts)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def load(path, map_location=None, **_):
        from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE

        state = safe_load(path, map_location=map_location)
        optim = state.get(OPTIMIZER_STATE_DICT) if isinstance(state, dict) else None
        if isinstance(optim, dict) and SINGLE_PARTITION_OF_FP32_GROUPS in optim and ZERO_STAGE not in optim:
            optim[ZERO_STAGE] = 1
        return state


def consolidated_state_dict(ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 model weights of the checkpoint :func:`select_checkpoint` picks (loaded weights-only)."""
    return read_weights(select_checkpoint(ckpt_dir, tag))


def read_weights(chosen: SelectedCheckpoint) -> dict[str, torch.Tensor]:
    """fp32 model weights of ``chosen`` (any ZeRO stage; a tensor-parallel checkpoint: consolidated
    per TP rank, then the slices merged, :func:`megatron_loop.parallel.checkpoint.read_whole_weights`)."""
    from megatron_loop.parallel.checkpoint import read_whole_weights

    whole = read_whole_weights(chosen, read_zero_weights)
    return whole if whole is not None else read_zero_weights(chosen)


def read_zero_weights(chosen: SelectedCheckpoint) -> dict[str, torch.Tensor]:
    """fp32 model weights of the one model replica in ``chosen``, consolidated by DeepSpeed's zero_to_fp32."""
    from deepspeed.utils import zero_to_fp32

    real_torch, zero_to_fp32.torch = zero_to_fp32.torch, _WeightsOnlyTorch()
    try:
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(chosen.root), tag=chosen.tag)
    except (FileNotFoundError, ValueError, RuntimeError, KeyError, EOFError,
            torch.serialization.pickle.UnpicklingError) as e:
        raise LoopDataError(f"{chosen.path}: cannot read DeepSpeed checkpoint "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    finally:
        zero_to_fp32.torch = real_torch
    return {k: v.float() for k, v in state.items()}


def report_selection(chosen: SelectedCheckpoint, file=None) -> None:
    """Tell a tool's user which checkpoint is read and which were skipped (stderr)."""
    file = file or sys.stderr
    for note in chosen.notes:
        print(f"warning: {note}", file=file)
    if chosen.skipped or chosen.newer:
        print(f"reading {chosen.path} (the newest complete checkpoint)", file=file)
    if chosen.manifest is None:
        print(f"warning: {chosen.path}: no {MANIFEST} (not written by pretrain_loop.py); read unverified",
              file=file)


def load_model_from_checkpoint(ckpt_dir: str | os.PathLike, tag: str | None = None, quiet: bool = False):
    """(LoopLM in fp32 eval mode, Config) from a training checkpoint folder (root or tag folder)."""
    from megatron_loop.model import build_model

    chosen = select_checkpoint(ckpt_dir, tag)
    if not quiet:
        report_selection(chosen)
    cfg = load_run_config(chosen.root)
    state = read_weights(chosen)
    model = build_model(cfg.model)
    # megatron-core linears add ``_extra_state`` entries (None); only tensors are weights.
    expected = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
        missing = sorted(set(expected) - set(state))[:3]
        unexpected = sorted(set(state) - set(expected))[:3]
        raise LoopDataError(
            f"{chosen.path}: checkpoint does not match the architecture in {CONFIG_NAME} "
            f"(missing {missing}, unexpected {unexpected}, or shapes differ)")
    model.load_state_dict(state, strict=False)
    return model.eval(), cfg
