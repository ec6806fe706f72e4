"""Shared, once-per-session assets for the data tests: a small generated corpus, a BPE
tokenizer trained on it, and the corpus preprocessed into an indexed prefix.

Plain cached functions rather than fixtures: a session fixture imported into several test
modules would be rebuilt per module (tests/conftest.py only puts this folder on sys.path).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testpaths import REPO  # also imported from here by several tests


@dataclass(frozen=True)
class DataAssets:
    root: Path
    corpus: Path       # generate_corpus output dir
    tokenizer: Path    # trained tokenizer folder
    prefix: str        # preprocessed train.jsonl (with a 50-document _valid prefix)
    documents: list    # the train.jsonl texts, in file order


@functools.lru_cache(maxsize=None)
def data_assets() -> DataAssets:
    from megatron_loop.data.corpus import CorpusSpec, generate_corpus
    from megatron_loop.data.preprocess import PreprocessOptions, preprocess
    from megatron_loop.data.sources import iter_local_documents
    from megatron_loop.data.tokenizer import train_bpe_tokenizer

    root = Path(tempfile.mkdtemp(prefix="looplm_data_tests_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    corpus = root / "corpus"
    generate_corpus(corpus, CorpusSpec(seed=7, prose_docs=300, reasoning_docs_per_task=200,
                                       valid_docs=60, eval_items_per_depth=8,
                                       train_max_depth=3, eval_max_depth=4))
    docs = list(iter_local_documents([corpus / "train.jsonl"]))
    tok = train_bpe_tokenizer(docs, root / "tokenizer", vocab_size=600)
    prefix = str(root / "data" / "train")
    preprocess(str(corpus / "train.jsonl"), str(tok), prefix,
               PreprocessOptions(validation_documents=50, progress=False, batch_size=128))
    return DataAssets(root, corpus, tok, prefix, docs)


def write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts), encoding="utf-8")
    return path


def run_tool(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``tools/<script>`` in a subprocess, offline, and capture its output."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, str(REPO / "tools" / script), *args], capture_output=True,
                          text=True, env=env, timeout=120)


class CodePayload:
    """Unpickling this runs a shell command (``touch marker``): what a tampered checkpoint could carry."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def copy_prefix(directory) -> str:
    """A private copy of the fixture's train prefix in ``directory`` (tests may damage it, and
    cache files written next to it do not leak between tests)."""

    src = data_assets().prefix
    for suffix in (".bin", ".idx"):
        shutil.copy(src + suffix, Path(directory) / f"p{suffix}")
    return str(Path(directory) / "p")
