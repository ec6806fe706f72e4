"""The data the GPU-session scripts' smoke runs read (tools/gpu_first.sh, tools/gpu_report.sh), built once
per test process: a plain cached function, as ``data_fixtures``."""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import tempfile
from itertools import dropwhile, takewhile
from pathlib import Path


@functools.lru_cache(maxsize=None)
def make_smoke_data() -> Path:
    """The layout tools/gpu_wheels.sh carries in .gpu/data (corpus.bin/.idx, tokenizer/), built in this
    process at the smoke's size (a second or two), once per test process (both smoke runs read it; they
    do not write to it). The data step's commands: tests/integration/tools/test_gpu_first.py."""
    root = Path(tempfile.mkdtemp(prefix="gpu_smoke_data_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    from megatron_loop.data.corpus import CorpusSpec, generate_corpus
    from megatron_loop.data.preprocess import PreprocessOptions, preprocess
    from megatron_loop.data.sources import iter_local_documents
    from megatron_loop.data.tokenizer import train_bpe_tokenizer

    generate_corpus(root / "corpus", CorpusSpec(seed=0, prose_docs=200, reasoning_docs_per_task=50, valid_docs=2,
                                                eval_items_per_depth=1))
    train = root / "corpus" / "train.jsonl"
    tokenizer = train_bpe_tokenizer(iter_local_documents([train]), root / "data" / "tokenizer", vocab_size=2048)
    preprocess(str(train), str(tokenizer), str(root / "data" / "corpus"), PreprocessOptions(progress=False))
    return root / "data"


def report_sections(markdown: str) -> dict[str, str]:
    """A GPU-session report (REPORT.md, SUMMARY.md) by ``## `` section: title -> text."""
    parts = re.split(r"^## ", markdown, flags=re.M)
    return {part.splitlines()[0].strip(): part for part in parts[1:]}


def markdown_table(text: str) -> list[dict[str, str]]:
    """The first markdown table of ``text`` as one dict per row (header -> cell)."""
    lines = list(takewhile(lambda ln: ln.startswith("|"),
                           dropwhile(lambda ln: not ln.startswith("|"), text.splitlines())))
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]
            if not ln.startswith("|---")]
