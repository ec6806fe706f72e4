"""Data pipeline (paper App. C.1): indexed datasets, packing, blending, sampling, corpus.

Submodules import megatron-core and transformers (seconds each) only when used, so the names
below are resolved lazily (``preprocess`` is the submodule; its function is
``megatron_loop.data.preprocess.preprocess``)::

    from megatron_loop.data import build_train_valid_loaders
    loaders = build_train_valid_loaders(cfg.data, seq_length=2048, global_batch_size=512,  # the typed DataConfig
                                        micro_batch_size=8, validation=cfg.train.eval_interval > 0,
                                        dp_rank=rank, dp_size=world, seed=1234, consumed_samples=0,
                                        vocab_size=128256, train_samples=steps * 512)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_train_valid_loaders": "loaders", "measure_loader_throughput": "loaders",
    "TrainValidLoaders": "loaders", "PackedDataset": "packed", "BlendedDataset": "blend",
    "GlobalBatchSampler": "sampler", "open_indexed": "indexed", "check_token_ids": "indexed",
    "measure_preprocess_throughput": "preprocess",
    "generate_corpus": "corpus", "train_bpe_tokenizer": "tokenizer", "load_tokenizer": "tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
