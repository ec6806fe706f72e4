"""A weights-only start (``train.init_from``): a new run starts from another run's model weights, as
Megatron-LM's ``--pretrained-checkpoint`` / ``--finetune`` and torchtitan's ``initial_load_path`` do.

Ouro (Zhu et al. 2025, Sec. 3) trains its exit gate in two stages: Stage I trains the whole LoopLM
with the entropy-regularised objective, Stage II (``train.exit_gate_objective: adaptive_gate``,
:mod:`megatron_loop.model.exit_gate`) trains only the gate of the model Stage I trained. A resume of
the Stage I run with the other objective is refused (its optimizer state covers other parameters,
:mod:`megatron_loop.training.resume`); Stage II is a new run with ``train.init_from`` naming Stage I's
checkpoint.

On a fresh start only (a run whose own ``train.output_dir`` holds a checkpoint resumes from it, and
says that ``init_from`` is ignored: its weights are in that checkpoint):

1. before the run folder is created (:func:`choose_source`, rank 0, every rank follows its answer or
   error): the checkpoint is selected and verified as an export selects it
   (:func:`megatron_loop.checkpoint.selection.select_checkpoint`: the ``latest`` of a checkpoint
   folder, or one ``global_stepN`` folder), its run config read, and the parameters of the model it
   describes compared with this config's by name and shape (:func:`check_parameters`; both built on
   the meta device): a parameter of the checkpoint the model lacks, or of another shape, is an error;
   one of the model the checkpoint lacks is an error unless ``train.init_from_missing: keep_init``
   (an exit gate added to a plain run keeps its initialisation);
2. after the model is built and before the DeepSpeed engine takes it (:func:`load_source_weights`,
   every rank): the fp32 weights consolidated over the checkpoint's ZeRO shards and TP ranks
   (:func:`megatron_loop.checkpoint.weights.read_weights`, DeepSpeed's zero_to_fp32) are copied into
   the plain model, each TP rank its slice (:func:`megatron_loop.parallel.shards.shard_of`). Loading
   before the engine exists is what makes every ZeRO stage and precision work alike: the engine
   then partitions (ZeRO 3), casts (bf16) and builds its fp32 master weights from these weights.
   Optimizer, schedule, step counter and data position start fresh. Under bf16 the fp32 master
   weights are therefore the bf16 rounding of the checkpoint's fp32 weights (the engine builds them
   from the bf16 module, as Megatron-LM's ``--finetune`` reloads them from the model), and each rank
   reads the whole consolidated fp32 state once (host memory: one fp32 copy of the model per rank).

The start event and the console name the source (:meth:`InitSource.describe`), and every checkpoint's
manifest records it (``init_from``), as the run config records ``train.init_from``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_loop.checkpoint.folders import CONFIG_NAME, load_run_config
from megatron_loop.checkpoint.manifest import model_signature
from megatron_loop.checkpoint.selection import SelectedCheckpoint, select_checkpoint
from megatron_loop.config import Config
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.training import distributed as D

MANIFEST_KEY = "init_from"  # what every checkpoint of a run started this way records


@dataclass(frozen=True)
class InitSource:
    """The checkpoint a weights-only start reads: where, at which step, of which run."""

    chosen: SelectedCheckpoint
    step: int | None
    run: str

    def record(self) -> dict[str, Any]:
        return {"path": str(self.chosen.path), "step": self.step, "run": self.run}

    def describe(self, kept: list[str] = ()) -> str:
        """The console line; ``kept``: the parameters left at their initialisation (``keep_init``)."""
        line = f"weights from {self.chosen.path} (step {self.step} of run {self.run}; train.init_from)"
        return line + (f"; kept at their initialisation (train.init_from_missing=keep_init): {', '.join(kept)}"
                       if kept else "")


def choose_source(cfg: Config, resuming: bool, info: D.DistInfo, placement=None) -> InitSource | None:
    """The checkpoint ``train.init_from`` names, checked against ``cfg`` at this rank's ``placement`` (None: one
    rank) (None: no ``init_from``, or the run resumes its own checkpoint). Rank 0 decides before the run folder
    is created; every rank follows."""
    if not cfg.train.init_from or resuming:
        return None

    def choose() -> InitSource:
        key = f"train.init_from={cfg.train.init_from!r}"
        try:
            chosen = select_checkpoint(cfg.train.init_from)
            saved = load_run_config(chosen.root)
        except LoopDataError as e:
            raise LoopDataError(f"{key}: {e}") from None
        check_parameters(saved, cfg, chosen.root / CONFIG_NAME, placement)
        from megatron_loop.config.naming import run_name

        return InitSource(chosen, chosen.step, run_name(saved))

    return D.on_main(info, choose, share=True)


def parameter_shapes(model_cfg, placement=None) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight of the model ``model_cfg`` describes, at the TP size of ``placement`` (None:
    one rank; built on the meta device: no memory, no initialisation)."""
    from megatron_loop.model import build_model

    model = build_model(model_cfg, placement, device="meta")
    return {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()
            if isinstance(t, torch.Tensor)}


def check_parameters(saved: Config, cfg: Config, where: Path, placement=None) -> list[str]:
    """Refuse (one line naming the run config ``where`` and the parameter) a checkpoint whose model
    ``saved`` has a parameter the model of ``cfg`` lacks or shapes differently, or lacks one of its
    parameters while ``train.init_from_missing`` is ``error``. Returns the parameters kept at their
    initialisation (``keep_init``)."""
    old, new = model_signature(saved), model_signature(cfg)
    differ = ", ".join(f"model.{k} {old[k]!r} -> {new.get(k)!r}" for k in sorted(old) if old[k] != new.get(k))
    why = f"; the configs differ in {differ}" if differ else ""
    # both at this run's TP size: the checkpoint's whole weights are sliced for it (its own TP size is irrelevant)
    theirs, ours = parameter_shapes(saved.model, placement), parameter_shapes(cfg.model, placement)
    for name, shape in theirs.items():
        if name not in ours:
            raise LoopConfigError(
                f"{where}: the checkpoint's parameter {name} {list(shape)} is not in the model of this config{why}; "
                "expected a checkpoint of this architecture (train.init_from)")
        if ours[name] != shape:
            raise LoopConfigError(
                f"{where}: parameter {name} has shape {list(shape)} in the checkpoint, {list(ours[name])} in the "
                f"model of this config{why}; expected a checkpoint of this architecture (train.init_from)")
    missing = [name for name in ours if name not in theirs]
    if missing and cfg.train.init_from_missing == "error":
        raise LoopConfigError(
            f"{where}: the checkpoint lacks {len(missing)} parameters of the model of this config "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}){why}; set train.init_from_missing=keep_init to start them from "
            "their initialisation, or start from a checkpoint of this architecture")
    return missing


def load_source_weights(model: torch.nn.Module, source: InitSource) -> list[str]:
    """Copy the checkpoint's consolidated fp32 weights into the plain ``model`` (before the engine);
    returns the parameters the checkpoint lacks (kept at their initialisation)."""
    from megatron_loop.checkpoint.weights import read_weights

    return copy_whole_weights(model, read_weights(source.chosen), source.chosen.path)


@torch.no_grad()
def copy_whole_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> list[str]:
    """Copy the TP = 1 weights ``state`` into ``model``, each TP rank its slice; returns the model's
    parameters ``state`` lacks. Names and shapes were checked against the checkpoint's run config
    (:func:`check_parameters`); weights that disagree with it are a damaged checkpoint."""
    from megatron_loop.parallel.shards import shard_of

    placement = model.tensor_parallel.placement  # the TP rank this model was built for
    rank, size = placement.tp_rank, placement.tp_size
    params = {name: t for name, t in model.state_dict(keep_vars=True).items() if isinstance(t, torch.Tensor)}
    for name, full in state.items():
        param = params.get(name)
        piece = None if param is None else shard_of(full, param, rank, size)
        if piece is None or piece.shape != param.shape:
            raise LoopDataError(f"{where}: weight {name} {list(full.shape)} does not fit the model its {CONFIG_NAME} "
                                "describes; expected the weights of that architecture (a damaged checkpoint)")
        param.copy_(piece)
    return [name for name in params if name not in state]
