"""``--mode data``: loader samples/s, and preprocessing tokens/s against the bare tokenizer."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from megatron_loop.data.loaders import measure_loader_throughput
from megatron_loop.data.preprocess import PreprocessOptions, measure_preprocess_throughput, preprocess

from .harness import Row, Setup
from .synthetic import generated_corpus


def bench_data(setup: Setup, input_spec: str | None, tokenizer: str | None, workers: int) -> list[Row]:
    """Loader and preprocessing throughput (the data package's own measurement functions)."""
    with tempfile.TemporaryDirectory() as tmp:
        if input_spec is None or tokenizer is None:
            input_spec, tokenizer = generated_corpus(Path(tmp))
        prefix = str(Path(tmp) / "bench_train")
        preprocess(input_spec, tokenizer, prefix, PreprocessOptions(progress=False, workers=workers))
        pre = measure_preprocess_throughput(input_spec, tokenizer, workers=workers)
        seq = min(setup.seq, 2048)
        loader = {"cold": measure_loader_throughput(prefix, seq_length=seq, micro_batch_size=8, num_batches=100),
                  "warm": measure_loader_throughput(prefix, seq_length=seq, micro_batch_size=8, num_batches=100)}
    rows = [Row("data", "preprocess vs bare tokenizer", {"workers": workers, "input": input_spec}, pre)]
    for label, m in loader.items():
        rows.append(Row("data", f"loader ({label} cache)", {"seq_length": seq, "micro_batch": 8}, m))
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_data(setup, args.data_input, args.tokenizer, args.workers)
