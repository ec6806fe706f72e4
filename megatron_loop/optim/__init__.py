"""Optimizer, WSD schedule and DeepSpeed engine (App. A.2 "Optimizer", "Learning-rate
scheduler", "Gradient accumulation and clipping"; issue 5 items 2-4)."""

from megatron_loop.optim.engine import (
    EngineParts,
    OptimizerSettings,
    attach_zero_layouts,
    build_engine,
    build_optimizer,
    init_distributed,
    load_ds_config,
    resolve_ds_config,
)
from megatron_loop.optim.muon import muon_scale, newton_schulz, orthogonalized_update
from megatron_loop.optim.optimizer import ADAMW_GROUP, MUON_GROUP, MuonAdamW, role_param_groups
from megatron_loop.optim.schedule import WSDMultiplier, WSDSplit, wsd_lambda, wsd_scheduler, wsd_split

__all__ = [
    "ADAMW_GROUP",
    "MUON_GROUP",
    "EngineParts",
    "MuonAdamW",
    "OptimizerSettings",
    "WSDMultiplier",
    "WSDSplit",
    "attach_zero_layouts",
    "build_engine",
    "build_optimizer",
    "init_distributed",
    "load_ds_config",
    "muon_scale",
    "newton_schulz",
    "orthogonalized_update",
    "resolve_ds_config",
    "role_param_groups",
    "wsd_lambda",
    "wsd_scheduler",
    "wsd_split",
]
