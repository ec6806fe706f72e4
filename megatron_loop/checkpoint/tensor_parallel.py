"""Checkpoints of a tensor-parallel run: what the manifest records, the resume check, whole weights.

DeepSpeed, given the model-parallel unit (:mod:`megatron_loop.parallel.mpu`), writes one model file
per TP rank (``mp_rank_{t:02d}_model_states.pt``, or ``zero_pp_rank_{d}_mp_rank_{t:02d}_model_states.pt``
at ZeRO 3) and one optimizer file per (DP, TP) rank (``[bf16_]zero_pp_rank_{d}_mp_rank_{t:02d}_optim_states.pt``),
all in the same ``global_step{N}`` folder, so the atomic save, the manifest over every file and the
exact resume of :mod:`megatron_loop.training.checkpoint` cover TP shards unchanged. The manifest
also records ``tensor_parallel``: the TP and DP sizes and, for every TP-sharded weight, how
megatron-core sliced it (``partition_dim``, ``partition_stride``), so an export can put the
slices back together without building a TP model.

A resume at another TP size (or, at TP > 1, another DP size) is refused with one line: the
per-rank files hold slices whose boundaries depend on the TP size, and the universal-checkpoint
conversion (:mod:`megatron_loop.checkpoint.universal`) re-partitions data-parallel ZeRO state only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.checkpoint.folders import MANIFEST
from megatron_loop.parallel.grads import is_tensor_parallel
from megatron_loop.parallel.shards import whole_of

MANIFEST_KEY = "tensor_parallel"


def manifest_fields(module: torch.nn.Module, placement) -> dict[str, Any]:
    """``{"tensor_parallel": {"size", "data_parallel_size", "sharded": {name: [dim, stride]}}}`` of ``module``
    trained at ``placement`` (:class:`~megatron_loop.model.placement.ParallelPlacement`: the TP and DP sizes)."""
    sharded = {name: [int(param.partition_dim), int(getattr(param, "partition_stride", 1))]
               for name, param in module.named_parameters() if is_tensor_parallel(param)}
    tp = placement.tp_size
    return {MANIFEST_KEY: {"size": tp, "data_parallel_size": placement.dp_size,
                           "sharded": sharded if tp > 1 else {}}}


def saved_layout(manifest: dict | None) -> tuple[int, int | None]:
    """(TP size, DP size or None) a checkpoint was written with (TP = 1 for checkpoints before TP)."""
    fields = (manifest or {}).get(MANIFEST_KEY) or {}
    return int(fields.get("size", 1)), fields.get("data_parallel_size")


def check_resume(manifest: dict | None, where: Path, tp: int, dp: int) -> None:
    """Refuse (one line) a resume whose TP size, or at TP > 1 whose DP size, differs from the checkpoint's."""
    saved_tp, saved_dp = saved_layout(manifest)
    if saved_tp != tp:
        raise LoopConfigError(
            f"{where}: written with parallel.tensor_model_parallel_size={saved_tp}, resumed with {tp}; the "
            f"per-rank files hold tensor-parallel slices of that size: resume with --set "
            f"parallel.tensor_model_parallel_size={saved_tp} (tools/convert_to_hf.py exports the weights at any TP)")
    if tp > 1 and saved_dp is not None and saved_dp != dp:
        raise LoopConfigError(
            f"{where}: written by {saved_dp} data-parallel x {tp} tensor-parallel ranks, resumed with {dp} x {tp}; "
            f"a tensor-parallel checkpoint resumes only on the same layout ({saved_dp * tp} ranks)")


def read_whole_weights(chosen, read_replica) -> dict[str, torch.Tensor] | None:
    """The TP = 1 fp32 weights of a TP > 1 checkpoint ``chosen`` (None at TP = 1).

    Each TP rank's slices are consolidated over the data-parallel ZeRO shards by ``read_replica``
    (:func:`megatron_loop.checkpoint.weights.read_zero_weights`, DeepSpeed's zero_to_fp32, weights-only) on a view
    of that rank's files, then every sharded weight is put back together from the slices in TP rank
    order with the layout the manifest recorded; replicated weights are taken from TP rank 0.
    """
    tp, _ = saved_layout(chosen.manifest)
    if tp == 1:
        if chosen.manifest is None and any("mp_rank_01_" in f.name for f in chosen.path.iterdir()):
            raise LoopDataError(f"{chosen.path}: tensor-parallel shards (mp_rank_01_*) without {MANIFEST}; "
                                "the slices can only be merged with the layout the manifest records")
        return None
    # stand-ins carrying megatron-core's partition attributes, as recorded at save
    sharded = {name: SimpleNamespace(tensor_model_parallel=True, partition_dim=int(dim), partition_stride=int(stride))
               for name, (dim, stride) in chosen.manifest[MANIFEST_KEY]["sharded"].items()}
    files = [[f for f in chosen.path.iterdir() if f"mp_rank_{rank:02d}_" in f.name] for rank in range(tp)]
    for rank, mine in enumerate(files):
        if not mine:
            raise LoopDataError(f"{chosen.path}: no files of tensor-parallel rank {rank} "
                                f"(mp_rank_{rank:02d}_*); the manifest records {tp} ranks")
    per_rank = []
    with tempfile.TemporaryDirectory(prefix="looplm-tp-") as tmp:
        for rank in range(tp):
            view = Path(tmp) / chosen.tag / f"mp_rank_{rank:02d}"
            view.mkdir(parents=True)
            for file in files[rank]:
                (view / file.name).symlink_to(file.resolve())
            try:
                per_rank.append(read_replica(type(chosen)(view.parent, view.name, None)))
            except LoopDataError as e:  # name the checkpoint, not the view
                raise LoopDataError(str(e).replace(str(view), f"{chosen.path} (tensor-parallel rank {rank})")) from None
    return {name: whole_of([state[name] for state in per_rank], sharded[name]) if name in sharded else first
            for name, first in per_rank[0].items()}
