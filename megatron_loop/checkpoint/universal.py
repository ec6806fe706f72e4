"""Resuming on another number of data-parallel ranks through DeepSpeed's universal checkpoint.

A ZeRO 1/2 checkpoint holds, per data-parallel rank, that rank's flat partition of the fp32
master weights and of every optimizer state, so it only loads on the same number of ranks.
DeepSpeed's *universal* layout stores the same tensors per parameter
(``<tag>/zero/<param name>/{fp32,<state>}.pt`` plus ``zero/optimizer_state.pt``), and an engine
built with ``"checkpoint": {"load_universal": true}`` loads it on any number of ranks
(``engine.load_checkpoint`` -> ``load_hp_checkpoint_state``, which re-partitions).

DeepSpeed's converter ``deepspeed.checkpoint.ds_to_universal`` extracts exactly ``fp32``,
``exp_avg``, ``exp_avg_sq`` and ``step``: on our Muon group it stops with ``KeyError: 'exp_avg'``,
because Muon's momentum (``momentum_buffer``, sharded by us over the same ZeRO partitions,
``megatron_loop.optim``) is not an Adam moment. :func:`to_universal` writes DeepSpeed's layout with
every per-element state the optimizer has (Muon's momentum included), and DeepSpeed's loader
reads whatever state files a parameter folder holds, so the momentum survives the change of
data-parallel size. Only ZeRO 1/2 (pipeline and tensor parallel degree 1, as in this project);
a ZeRO 3 checkpoint keeps its data-parallel size (:mod:`megatron_loop.training.resume`).
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path

import torch

from megatron_loop.errors import LoopDataError
from megatron_loop.checkpoint.weights import safe_load

MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIM_STATES = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def optimizer_shards(tag_dir: Path) -> list[Path]:
    """The per-rank ZeRO 1/2 optimizer files of a checkpoint, in data-parallel rank order."""
    found = [(int(m.group(1)), p) for p in tag_dir.iterdir() if (m := OPTIM_STATES.match(p.name))]
    return [p for _, p in sorted(found)]


def to_universal(tag_dir: Path, out_dir: Path) -> Path:
    """Write ``tag_dir`` (a ZeRO 1/2 checkpoint of any data-parallel size) in DeepSpeed's universal
    layout under ``out_dir / tag_dir.name``; returns that folder. Files are read weights-only."""
    from deepspeed.checkpoint import (BASE_OPTIMIZER_STATE, CAT_DIM, OPTIMIZER_STATE_DICT, PARAM, PARAM_GROUPS,
                                      PARAM_SHAPES, PARAM_SLICE_MAPPINGS, SINGLE_PARTITION_OF_FP32_GROUPS)

    shards = optimizer_shards(tag_dir)
    if not shards or not (tag_dir / MODEL_STATES).is_file():
        raise LoopDataError(f"{tag_dir}: no ZeRO 1/2 optimizer shards or {MODEL_STATES}; "
                            "only ZeRO 1/2 checkpoints convert to DeepSpeed's universal layout")
    target = out_dir / tag_dir.name
    target.mkdir(parents=True, exist_ok=True)
    model_states = safe_load(tag_dir / MODEL_STATES, map_location="cpu")
    shapes = {name: shape for group in model_states[PARAM_SHAPES] for name, shape in group.items()}

    pieces: dict[str, dict[str, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
    steps: dict[str, torch.Tensor] = {}
    first = None
    for shard in shards:  # data-parallel rank order: fragments concatenate into whole tensors
        optim = safe_load(shard, map_location="cpu")[OPTIMIZER_STATE_DICT]
        first = first or optim
        for group, mapping in enumerate(optim[PARAM_SLICE_MAPPINGS]):
            flat = optim[SINGLE_PARTITION_OF_FP32_GROUPS][group]
            state = optim[BASE_OPTIMIZER_STATE]["state"].get(group, {})
            per_element = {"fp32": flat, **{k: v for k, v in state.items()
                                            if torch.is_tensor(v) and v.shape == flat.shape}}
            for name, fragment in mapping.items():
                for key, tensor in per_element.items():
                    pieces[name][key].append(tensor.narrow(0, fragment.start, fragment.numel).clone())
                if "step" in state:
                    steps[name] = state["step"]
    zero = target / "zero"
    for name, states in pieces.items():
        folder = zero / name
        folder.mkdir(parents=True, exist_ok=True)
        for key, parts in states.items():
            torch.save({PARAM: torch.cat(parts).view(shapes[name]), CAT_DIM: 0}, folder / f"{key}.pt")
        if name in steps:
            torch.save(steps[name], folder / "step.pt")
    sharded = (BASE_OPTIMIZER_STATE, PARAM_SLICE_MAPPINGS, SINGLE_PARTITION_OF_FP32_GROUPS)
    common = {k: v for k, v in first.items() if k not in sharded}
    common[PARAM_GROUPS] = first[BASE_OPTIMIZER_STATE][PARAM_GROUPS]
    torch.save(common, zero / "optimizer_state.pt")  # as ds_to_universal's _save_optimizer_state
    shutil.copy2(tag_dir / MODEL_STATES, target / MODEL_STATES)
    return target
