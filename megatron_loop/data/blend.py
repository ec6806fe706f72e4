"""Weighted, deterministic blending of several packed datasets.

The paper trains on one corpus (App. C.1); blending serves mixes such as prose plus the
generated reasoning corpus. The schedule is megatron-core's deterministic greedy one: after any
``n`` samples each component has contributed ``n * w_k`` samples to within two, and nothing but
the weights decides the order (the components are already seed-shuffled, see ``packed.py``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from megatron_loop.errors import LoopConfigError, LoopDataError


def normalise_weights(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise LoopConfigError(f"blend weights {list(weights)}: expected one positive number per prefix")
    return w / w.sum()


def blend_index(weights: Sequence[float], num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index, dataset_sample_index)`` arrays of length ``num_samples``.

    Uses megatron-core's compiled greedy scheduler (the one behind its BlendedDataset): sample
    ``i`` comes from the component furthest below its target ``w_k * (i + 1)``.
    """
    from megatron.core.datasets import helpers_cpp

    w = normalise_weights(weights)
    if len(w) >= 2**15:
        raise LoopConfigError(f"{len(w)} blend components; expected fewer than 32768")
    dataset_index = np.zeros(num_samples, dtype=np.int16)
    dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, dataset_sample_index, w, len(w), num_samples, False)
    return dataset_index, dataset_sample_index


def samples_needed(weights: Sequence[float], num_samples: int) -> list[int]:
    """Samples each component must provide for a blend of ``num_samples``."""
    dataset_index, _ = blend_index(weights, num_samples)
    return np.bincount(dataset_index, minlength=len(weights)).astype(int).tolist()


def max_blend_samples(sizes: Sequence[int], weights: Sequence[float]) -> int:
    """Largest blend length that takes at most ``sizes[k]`` samples from each component (the
    schedule is prefix-consistent, so the answer is where some component would overrun)."""
    w = normalise_weights(weights)
    upper = int(min(n / wk for n, wk in zip(sizes, w))) + len(w) + 2
    which, _ = blend_index(w, upper)
    limit = upper
    for k, size in enumerate(sizes):
        taken = np.flatnonzero(which == k)
        if len(taken) > size:
            limit = min(limit, int(taken[size]))  # position of its (size + 1)-th sample
    return limit


class BlendedDataset(torch.utils.data.Dataset):
    """``num_samples`` items drawn from ``datasets`` in proportion to ``weights``."""

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float],
                 num_samples: int) -> None:
        if len(datasets) != len(weights):
            raise LoopConfigError(f"{len(datasets)} datasets but {len(weights)} blend weights; "
                                  "expected one weight per prefix")
        self.datasets = list(datasets)
        self.weights = normalise_weights(weights)
        self.dataset_index, self.dataset_sample_index = blend_index(self.weights, num_samples)
        needed = np.bincount(self.dataset_index, minlength=len(datasets))
        for ds, need in zip(self.datasets, needed):
            if need > len(ds):
                name = getattr(ds, "prefix", repr(ds))
                raise LoopDataError(f"blend needs {need} samples from '{name}' but it has {len(ds)}; "
                                    "expected a dataset built with enough epochs")

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int):
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]
