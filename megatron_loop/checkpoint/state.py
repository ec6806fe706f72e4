"""What a checkpoint carries besides DeepSpeed's model, optimizer and scheduler state, for a resume
that continues bit for bit: the loop counters (DeepSpeed ``client_state``) and every rank's
Python, numpy and torch RNG states (``rng_state_rank{r}.pt``, plain containers that load with
``torch.load(weights_only=True)``)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from megatron_loop.errors import LoopDataError

RNG_FILE = "rng_state_rank{rank}.pt"


@dataclass
class TrainState:
    """Loop counters saved as DeepSpeed ``client_state`` (data position for the sampler)."""

    step: int = 0  # global batches consumed (optimizer iterations, skipped ones included)
    consumed_samples: int = 0
    skipped_updates: int = 0  # non-finite steps whose update was skipped (train.nan_policy: skip)
    consecutive_nonfinite: int = 0

    def client_state(self) -> dict[str, int]:
        return {"looplm_train_state": dataclasses.asdict(self)}

    @classmethod
    def from_client_state(cls, client_state: dict, where: str) -> "TrainState":
        state = (client_state or {}).get("looplm_train_state")
        if not isinstance(state, dict):
            raise LoopDataError(f"{where}: no training state in the DeepSpeed client_state; "
                                "expected a checkpoint written by pretrain_loop.py")
        return cls(**{f.name: int(state[f.name]) for f in dataclasses.fields(cls)})


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch RNG states as plain containers (loadable with weights_only=True)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(mt), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
