"""The data the modes run on when they are given none: random token batches, a random-token
indexed dataset (what training reads), and the generated corpus with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_loop.config import ModelConfig
from megatron_loop.data.corpus import CorpusSpec, generate_corpus
from megatron_loop.data.sources import iter_local_documents
from megatron_loop.data.tokenizer import train_bpe_tokenizer

from .harness import Setup


def random_tokens(cfg: ModelConfig, setup: Setup, micro_batch: int | None = None) -> torch.Tensor:
    """``[micro_batch, seq]`` token ids below the vocabulary, the same for every case (seeded)."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (micro_batch or setup.micro_batch, setup.seq), generator=g)
    return tokens.to(setup.device)


def random_token_dataset(root: Path, vocab: int, tokens: int) -> str:
    """Random-token documents (ids below ``vocab``) in megatron-core's indexed format; the prefix."""
    prefix = str(root / "synthetic")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(max(1, tokens // 1000)):
        builder.add_document(torch.from_numpy(rng.integers(0, vocab, 1000, dtype=np.int32)), [1000])
    builder.finalize(prefix + ".idx")
    return prefix


def generated_corpus(root: Path) -> tuple[str, str]:
    """The generated CPU corpus and a BPE tokenizer trained on it (what ``make demo`` uses):
    (documents, tokenizer directory)."""
    corpus = root / "corpus"
    generate_corpus(corpus, CorpusSpec(seed=3, prose_docs=1500, reasoning_docs_per_task=1000, valid_docs=10,
                                       eval_items_per_depth=2))
    docs = list(iter_local_documents([corpus / "train.jsonl"]))
    tok = train_bpe_tokenizer(docs[:2000], root / "tokenizer", vocab_size=2048)
    return str(corpus / "train.jsonl"), str(tok)
