"""Shared helpers of the probe tests: a tiny LoopLM with non-zero conditioning and a tiny
indexed prefix written with megatron-core's IndexedDatasetBuilder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from megatron_loop.config import build_model_config
from megatron_loop.model import build_model
from megatron_loop.parallel.parallelize import apply_compile


def tiny_model(prelude: int = 0, coda: int = 0, seed: int = 0, train_loops: int = 3, compile: bool = False):
    """tiny-llama ``prelude + 2 x train_loops + coda`` with scalar injection and loop gating whose
    parameters are moved off their identity initialisation (so z != x and x^{t+1} != y);
    ``compile``: blocks compiled in place as training compiles them (``parallel.parallelize.apply_compile``)."""
    torch.manual_seed(seed)
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=2, train_loops=train_loops,
                                  prelude_layers=prelude, coda_layers=coda,
                                  initial_injection="scalar", timestep="loop_gating"))
    model = build_model(cfg).eval()
    if compile:
        apply_compile(model)
    with torch.no_grad():
        model.initial_injection.alpha.fill_(0.4)
        model.loop_gating.q.copy_(torch.linspace(-0.6, 0.8, 8))
    return model


def conditioned_model(prelude: int = 1, coda: int = 2, **conditioning):
    """tiny-llama ``prelude + 2 x 3 + coda`` with the given conditioning, its vector parameters moved off
    their initialisation (gates, norms and injections active)."""
    torch.manual_seed(0)
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=2, train_loops=3, prelude_layers=prelude,
                                  coda_layers=coda, **conditioning))
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def write_prefix(directory: Path, num_docs: int = 12, vocab: int = 2000, seed: int = 0) -> str:
    """An indexed prefix of ``num_docs`` random documents (17-40 tokens each)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    prefix = str(directory / "valid")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for _ in range(num_docs):
        builder.add_item(torch.from_numpy(rng.integers(1, vocab, size=int(rng.integers(17, 41))).astype(np.int32)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
