"""Reading a checkpoint's tensors back: weights-only unpickling (tensors, containers and an
allow-list of DeepSpeed's checkpoint classes; a checkpoint carrying code does not run) and the
fp32 model weights consolidated with DeepSpeed's own ``zero_to_fp32`` utilities, which handle
ZeRO 1/2 flat partitions and ZeRO 3 parameter shards alike."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import torch

from megatron_loop.checkpoint.selection import SelectedCheckpoint, select_checkpoint
from megatron_loop.errors import LoopDataError
from megatron_loop.optim.schedule import WSDMultiplier

_SAFE_DEEPSPEED_GLOBALS: list | None = None


def deepspeed_safe_globals() -> list:
    """Classes DeepSpeed pickles into its checkpoints besides tensors and containers."""
    global _SAFE_DEEPSPEED_GLOBALS
    if _SAFE_DEEPSPEED_GLOBALS is None:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        _SAFE_DEEPSPEED_GLOBALS = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address,
                                   WSDMultiplier, set]
    return _SAFE_DEEPSPEED_GLOBALS


def safe_load(path, map_location=None):
    """``torch.load`` with ``weights_only=True``: only tensors, containers and the allow-list of
    DeepSpeed's own checkpoint classes unpickle; a checkpoint carrying code does not run."""
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


def restrict_unpickling(engine) -> None:
    """Make DeepSpeed's checkpoint reader use ``torch.load(weights_only=True)`` (it defaults to
    False): only tensors, containers and an allow-list of DeepSpeed's own classes unpickle."""
    engine.checkpoint_engine.load = lambda path, map_location=None: safe_load(path, map_location)


class _WeightsOnlyTorch:
    """``torch`` as DeepSpeed's ``zero_to_fp32`` sees it, except that ``torch.load`` unpickles with
    ``weights_only=True`` (zero_to_fp32 hard-codes False) and a bf16 ZeRO 1 shard reads as ZeRO 1.

    bf16 runs at ZeRO 1 train with DeepSpeed's BF16_Optimizer (fp32 gradient accumulation,
    :mod:`megatron_loop.optim.engine`), whose ``bf16_zero_pp_rank_*`` shards carry no
    ``zero_stage``, so zero_to_fp32 calls them "not a zero checkpoint"; their fp32 partitions are
    laid out as ZeRO 1's (each group's weights back to back, padding at the end, equal parts).

    The module state dicts it reads are kept (``module_states``): at ZeRO 1 DeepSpeed records no frozen
    parameters for zero_to_fp32 (it does from ZeRO 2 on), so parameters without optimizer state
    (``requires_grad=False``: the LM of Ouro's Stage II) are read from there (:func:`read_zero_weights`)."""

    def __init__(self):
        self.module_states: list[dict] = []

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def load(self, path, map_location=None, **_):
        from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_STAGE

        state = safe_load(path, map_location=map_location)
        if isinstance(state, dict) and isinstance(state.get("module"), dict):
            self.module_states.append(state["module"])
        optim = state.get(OPTIMIZER_STATE_DICT) if isinstance(state, dict) else None
        if isinstance(optim, dict) and SINGLE_PARTITION_OF_FP32_GROUPS in optim and ZERO_STAGE not in optim:
            optim[ZERO_STAGE] = 1
        return state


def consolidated_state_dict(ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 model weights of the checkpoint :func:`select_checkpoint` picks (loaded weights-only)."""
    return read_weights(select_checkpoint(ckpt_dir, tag))


def read_weights(chosen: SelectedCheckpoint) -> dict[str, torch.Tensor]:
    """fp32 model weights of ``chosen`` (any ZeRO stage; a tensor-parallel checkpoint: consolidated
    per TP rank, then the slices merged, :func:`megatron_loop.checkpoint.tensor_parallel.read_whole_weights`)."""
    from megatron_loop.checkpoint.tensor_parallel import read_whole_weights  # megatron-core: loaded only here

    whole = read_whole_weights(chosen, read_zero_weights)
    return whole if whole is not None else read_zero_weights(chosen)


def read_weights_or_newest(chosen: SelectedCheckpoint, path: str | os.PathLike, tag: str | None = None,
                           attempts: int = 3) -> tuple[SelectedCheckpoint, dict[str, torch.Tensor]]:
    """(the checkpoint read, its fp32 weights): ``chosen`` (picked by :func:`select_checkpoint` from
    ``path`` and ``tag``), or, when it was removed while it was read -- a live run's retention
    (``train.keep_last``) deletes old checkpoints while an export of one reads it -- the newest
    complete checkpoint now, with a line saying which was removed. A checkpoint named explicitly
    (``tag``, or a tag folder as ``path``) is not swapped for another: one line says it was removed."""
    from megatron_loop.checkpoint.selection import split_checkpoint_path

    for _ in range(attempts):
        try:
            return chosen, read_weights(chosen)
        except LoopDataError:
            if _intact(chosen):  # a damaged checkpoint, not one removed under the reader
                raise
        gone = chosen.path
        why = (f"{gone}: removed while it was read (a live run's retention keeps only the newest train.keep_last "
               "checkpoints, a resume sets newer ones aside)")
        if tag is not None or split_checkpoint_path(Path(path))[1] is not None:
            raise LoopDataError(f"{why}; expected a checkpoint the run keeps: name a newer one, or the run's "
                                f"checkpoint folder {chosen.root} for its newest") from None
        chosen = select_checkpoint(chosen.root)
        print(f"warning: {why}; reading {chosen.path} (the newest complete checkpoint)", file=sys.stderr)
    raise LoopDataError(f"{chosen.root}: its checkpoints were removed while they were read {attempts} times; "
                        "expected a checkpoint folder whose run keeps them (export when it saves less often, or "
                        "raise train.keep_last)")


def _intact(chosen: SelectedCheckpoint) -> bool:
    """``chosen`` is still what it was when it was picked (its files as its manifest lists them)."""
    from megatron_loop.checkpoint.manifest import verify_checkpoint

    try:
        verify_checkpoint(chosen.path) if chosen.manifest is not None else chosen.path.stat()
        return True
    except (LoopDataError, OSError):
        return False


def read_zero_weights(chosen: SelectedCheckpoint) -> dict[str, torch.Tensor]:
    """fp32 model weights of the one model replica in ``chosen``, consolidated by DeepSpeed's zero_to_fp32."""
    from deepspeed.utils import zero_to_fp32

    reader = _WeightsOnlyTorch()
    real_torch, zero_to_fp32.torch = zero_to_fp32.torch, reader
    try:  # zero_to_fp32 prints its progress on stdout, where the tools print their results: kept out
        with contextlib.redirect_stdout(io.StringIO()):
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(chosen.root), tag=chosen.tag)
    except (FileNotFoundError, ValueError, RuntimeError, KeyError, EOFError,
            torch.serialization.pickle.UnpicklingError) as e:
        raise LoopDataError(f"{chosen.path}: cannot read DeepSpeed checkpoint "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    finally:
        zero_to_fp32.torch = real_torch
    for module in reader.module_states[:1]:  # frozen parameters at ZeRO 1 (whole there; ZeRO 3's are empty)
        state.update({k: v for k, v in module.items() if k not in state and torch.is_tensor(v) and v.numel() > 0})
    return {k: v.float() for k, v in state.items()}
