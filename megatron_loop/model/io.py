"""Reading a trained LoopLM back from a DeepSpeed checkpoint folder (any ZeRO stage).

Checkpoint folder contract (written by the training loop):

    CKPT_DIR/latest                 DeepSpeed's pointer to the newest complete tag
    CKPT_DIR/<tag>/...              DeepSpeed shards (model states, ZeRO optimizer partitions)
    CKPT_DIR/looplm_config.json     the resolved run config (``Config.to_dict()``)

Weights are consolidated with DeepSpeed's own ``zero_to_fp32`` utilities, which handle
ZeRO 1/2 flat partitions and ZeRO 3 parameter shards alike.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from megatron_loop.config import Config, config_from_dict
from megatron_loop.errors import LoopDataError

CONFIG_NAME = "looplm_config.json"


def save_run_config(directory: str | os.PathLike, cfg: Config) -> Path:
    """Write ``looplm_config.json`` atomically (temp file + rename)."""
    path = Path(directory) / CONFIG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg.to_dict(), indent=2))
    os.replace(tmp, path)
    return path


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


def resolve_tag(ckpt_dir: str | os.PathLike, tag: str | None = None) -> str:
    ckpt_dir = Path(ckpt_dir)
    if tag is None:
        latest = ckpt_dir / "latest"
        if not latest.is_file():
            raise LoopDataError(f"{latest}: missing; expected DeepSpeed's 'latest' tag file (or pass a tag)")
        tag = latest.read_text().strip()
    if not (ckpt_dir / tag).is_dir():
        raise LoopDataError(f"{ckpt_dir / tag}: checkpoint tag folder not found")
    return tag


class _WeightsOnlyTorch:
    """``torch`` as DeepSpeed's ``zero_to_fp32`` sees it, except that ``torch.load`` unpickles with
    ``weights_only=True`` (zero_to_fp32 hard-codes False): only tensors, containers and the
    allow-list of DeepSpeed's own checkpoint classes load; a checkpoint carrying code does not run."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def load(*args, **kwargs):
        from megatron_loop.training.checkpoint import deepspeed_safe_globals

        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(*args, **kwargs)


def consolidated_state_dict(ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 model weights from a DeepSpeed checkpoint of any ZeRO stage (loaded weights-only)."""
    from deepspeed.utils import zero_to_fp32

    tag = resolve_tag(ckpt_dir, tag)
    real_torch, zero_to_fp32.torch = zero_to_fp32.torch, _WeightsOnlyTorch()
    try:
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
    except (FileNotFoundError, ValueError, RuntimeError, KeyError, EOFError,
            torch.serialization.pickle.UnpicklingError) as e:
        raise LoopDataError(f"{Path(ckpt_dir) / tag}: cannot read DeepSpeed checkpoint "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    finally:
        zero_to_fp32.torch = real_torch
    return {k: v.float() for k, v in state.items()}


def load_model_from_checkpoint(ckpt_dir: str | os.PathLike, tag: str | None = None):
    """(LoopLM in fp32 eval mode, Config) from a training checkpoint folder."""
    from megatron_loop.model import build_model

    cfg = load_run_config(ckpt_dir)
    state = consolidated_state_dict(ckpt_dir, tag)
    model = build_model(cfg.model)
    # megatron-core linears add ``_extra_state`` entries (None); only tensors are weights.
    expected = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
        missing = sorted(set(expected) - set(state))[:3]
        unexpected = sorted(set(state) - set(expected))[:3]
        raise LoopDataError(
            f"{ckpt_dir}: checkpoint does not match the architecture in {CONFIG_NAME} "
            f"(missing {missing}, unexpected {unexpected}, or shapes differ)")
    model.load_state_dict(state, strict=False)
    return model.eval(), cfg
