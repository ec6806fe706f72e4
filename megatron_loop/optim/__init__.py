"""Optimizer, WSD schedule and DeepSpeed engine (App. C.2 "Optimizer", "Learning-rate
scheduler", "Gradient accumulation and clipping"). The DeepSpeed JSON is
:mod:`megatron_loop.config.deepspeed`'s; process groups are :mod:`megatron_loop.parallel.bootstrap`'s.

Names are resolved lazily (as in ``megatron_loop.data``): ``megatron_loop.optim.schedule`` is
imported by ``pretrain_loop.py --dry-run``, which must not pay for torch and DeepSpeed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngineParts": "engine", "OptimizerSettings": "engine", "attach_zero_layouts": "engine",
    "build_engine": "engine", "build_optimizer": "engine", "describe_precision": "engine",
    "muon_scale": "muon", "newton_schulz": "muon", "orthogonalized_update": "muon",
    "ADAMW_GROUP": "optimizer", "MUON_GROUP": "optimizer", "MuonAdamW": "optimizer",
    "role_param_groups": "optimizer",
    "WSDMultiplier": "schedule", "WSDSplit": "schedule", "wsd_lambda": "schedule", "wsd_scheduler": "schedule",
    "wsd_split": "schedule",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
