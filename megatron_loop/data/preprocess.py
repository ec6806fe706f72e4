"""Tokenise documents into Megatron indexed datasets (``P.bin``/``P.idx``), App. C.1.

Every document is encoded without BOS (``add_special_tokens=False``) and terminated with the
tokenizer's EOS; one indexed sequence per document. Text that spells a special token (a literal
``<|endoftext|>`` in a web page) is encoded as the text it is (``split_special_tokens=True``): only
the EOS appended here ends a document. Encoding is batched and spread over
``workers`` processes of one thread each (``Pool.imap`` keeps document order; the tokenizer's own
Rust thread pool is off, so ``workers`` is the number of cores used). Token ids are stored as uint16
when the vocabulary fits (megatron-core ``DType.optimal_dtype``), else int32.

Outputs for ``--output-prefix P``:
  ``P.bin``/``P.idx``           training documents;
  ``P_valid.bin``/``P_valid.idx`` the first ``validation_documents`` documents, held out;
  ``P.stats.json``              documents, tokens, dtype, tokenizer, throughput.
Files are written under ``P.tmp<pid>*`` names and renamed only on success, so an interrupted
run never leaves a partial file under a final name.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from megatron_loop.atomic import write_atomic
from megatron_loop.console import show_progress
from megatron_loop.config import VALID_SUFFIX
from megatron_loop.cli import check_output_folder
from megatron_loop.data.sources import ENCODING_ERRORS, HFSource, iter_documents
from megatron_loop.cli import host_cores
from megatron_loop.data.tokenizer import check_tokenizer_location, load_tokenizer
from megatron_loop.errors import LoopDataError, os_error_text, user_path


# The tokenizer used by encode workers. Set in the parent before the pool forks, so workers
# inherit it instead of reloading it from disk or the hub.
_TOKENIZER = None


def _set_tokenizer(tok) -> None:
    global _TOKENIZER
    _TOKENIZER = tok


def encode_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` (no BOS, EOS appended) as one flat int32 array plus lengths.

    Returning two arrays instead of nested lists keeps the pickling cost between processes small.
    """
    tok = _TOKENIZER
    # split_special_tokens: a literal "<|endoftext|>" in a document is text, not an EOS inside it
    ids = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    eos = tok.eos_token_id
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(x + [eos] for x in ids), dtype=np.int32,
                       count=int(lengths.sum()))
    return flat, lengths


def _count_bare(texts: list[str]) -> int:
    """The baseline the pipeline is compared to: ``tokenizer(batch)`` and nothing else."""
    return sum(len(x) for x in _TOKENIZER(texts)["input_ids"])


def _batches(docs: Iterable[str], batch_size: int) -> Iterator[list[str]]:
    it = iter(docs)
    while batch := list(itertools.islice(it, batch_size)):
        yield batch


def _map_ordered(fn, batches: Iterable[list[str]], tok, workers: int) -> Iterator:
    """``fn`` over ``batches`` in order, in-process (workers <= 1) or in a forked pool.

    Each encoding process runs one thread, so ``workers`` is the number of cores used: a fast
    tokenizer's batch call otherwise spreads over every core through its Rust thread pool (unless
    ``TOKENIZERS_PARALLELISM=false``), and ``--workers 1`` would use them all while its throughput
    reads as one core's. The variable is set for the run (inherited by the forked workers) and
    restored after it, so a process that goes on to train is not left single-threaded."""
    _set_tokenizer(tok)
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by the tokenizers library at every batch call
    try:
        if workers <= 1:
            yield from map(fn, batches)
            return
        # Ctrl-C reaches the whole foreground process group: the parent stops the pool and says so in
        # one line (cli.run_cli); the workers must not each print a KeyboardInterrupt traceback
        with mp.get_context("fork").Pool(workers, initializer=signal.signal,
                                          initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
            yield from pool.imap(fn, batches, chunksize=1)
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


class _PrefixWriter:
    """An ``IndexedDatasetBuilder`` writing under temporary names, renamed by ``commit``."""

    def __init__(self, prefix: str, dtype: type) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self.prefix = prefix
        self.tmp = f"{prefix}.tmp{os.getpid()}"
        self.dtype = dtype
        self.builder = IndexedDatasetBuilder(self.tmp + ".bin", dtype=dtype)
        self.documents = 0
        self.tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        bounds = np.concatenate(([0], np.cumsum(lengths)))
        for i, n in enumerate(lengths.tolist()):
            self.builder.add_document(tokens[bounds[i]:bounds[i + 1]], [n])
        self.documents += len(lengths)
        self.tokens += int(bounds[-1])

    def commit(self) -> None:
        self.builder.finalize(self.tmp + ".idx")
        # Drop an old .idx first: a crash between the renames then leaves a prefix without
        # .idx ("missing" error) rather than the new .bin paired with a stale index.
        Path(self.prefix + ".idx").unlink(missing_ok=True)
        os.replace(self.tmp + ".bin", self.prefix + ".bin")
        os.replace(self.tmp + ".idx", self.prefix + ".idx")

    def discard(self) -> None:
        """Remove the temporary files, whatever state the writer is in: on a full disk closing the
        file flushes its buffer and fails again (the file is closed all the same), which must not
        keep the temporary files on the disk that just filled up."""
        if not self.builder.data_file.closed:
            with contextlib.suppress(OSError):
                self.builder.data_file.close()
        for suffix in (".bin", ".idx"):
            with contextlib.suppress(OSError):
                Path(self.tmp + suffix).unlink(missing_ok=True)


@dataclass
class PreprocessOptions:
    """Everything but input, tokenizer and output prefix (CLI flags of the same names)."""

    json_key: str = "text"
    workers: int = 1
    batch_size: int = 1000
    validation_documents: int = 0
    max_documents: int | None = None
    text_unit: str = "file"
    eos_token: str | None = None
    hf: HFSource = field(default_factory=lambda: HFSource(""))
    progress: bool = True
    encoding_errors: str = "strict"  # local text inputs that are not UTF-8: stop, or read as U+FFFD


def preprocess(input_spec: str, tokenizer: str, output_prefix: str,
               options: PreprocessOptions = PreprocessOptions()) -> dict:
    """Tokenise ``input_spec`` into ``output_prefix`` (+ ``_valid``); returns the stats dict."""
    from tqdm import tqdm

    check_tokenizer_location(tokenizer)  # a mistyped folder must not wait for the input to be read
    # transformers and megatron-core take seconds to import: input errors are reported first.
    docs_iter = iter_documents(input_spec, options.json_key, options.text_unit, options.hf, options.encoding_errors)
    docs = (d for d in docs_iter if d)  # an empty document would be a lone EOS; skip it
    if options.max_documents is not None:
        docs = itertools.islice(docs, options.max_documents)
    first = next(docs, None)
    if first is None:
        raise LoopDataError(f"input '{input_spec}' contains no non-empty documents (json key "
                            f"'{options.json_key}'); expected at least one")
    docs = itertools.chain([first], docs)
    tok = load_tokenizer(tokenizer, options.eos_token)
    from megatron.core.datasets.indexed_dataset import DType

    dtype = DType.optimal_dtype(len(tok))
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    writers: dict[str, _PrefixWriter] = {}
    start = time.perf_counter()
    try:
        writers["train"] = _PrefixWriter(output_prefix, dtype)
        if options.validation_documents > 0:
            writers["valid"] = _PrefixWriter(output_prefix + VALID_SUFFIX, dtype)
        with tqdm(total=options.max_documents, unit="doc", disable=not options.progress,
                  desc=f"tokenising {input_spec}") as bar:
            total_tokens = 0
            for tokens, lengths in _map_ordered(encode_batch, _batches(docs, options.batch_size),
                                                tok, options.workers):
                _route(writers, tokens, lengths, options.validation_documents)
                total_tokens += len(tokens)
                bar.update(len(lengths))
                bar.set_postfix(tokens_per_s=f"{total_tokens / max(bar.format_dict['elapsed'], 1e-9):.3g}",
                                refresh=False)
        _check_counts(writers, input_spec, options)
        for w in writers.values():
            w.commit()
    except OSError as e:  # a full disk, a quota, a file-size limit: the prefix, the condition, nothing left
        target = f": {user_path(os.fsdecode(e.filename))}" if e.filename else ""
        raise LoopDataError(f"--output-prefix {output_prefix}: writing the indexed dataset failed "
                            f"({os_error_text(e)}{target}); nothing was published and its temporary files "
                            "are removed") from None
    finally:
        for w in writers.values():
            w.discard()
    seconds = time.perf_counter() - start
    stats = _stats(writers, tok, tokenizer, input_spec, dtype, seconds, options)
    _write_json_atomic(Path(output_prefix + ".stats.json"), stats)
    return stats


def _route(writers: dict, tokens: np.ndarray, lengths: np.ndarray, n_valid: int) -> None:
    """Send the first ``n_valid`` documents of the whole stream to the validation writer."""
    take = 0
    if "valid" in writers:
        take = max(0, min(len(lengths), n_valid - writers["valid"].documents))
    if take:
        cut = int(lengths[:take].sum())
        writers["valid"].add(tokens[:cut], lengths[:take])
        tokens, lengths = tokens[cut:], lengths[take:]
    if len(lengths):
        writers["train"].add(tokens, lengths)


def _check_counts(writers: dict, input_spec: str, options: PreprocessOptions) -> None:
    held = writers["valid"].documents if "valid" in writers else 0
    if writers["train"].documents == 0:
        raise LoopDataError(f"input '{input_spec}' has {held} documents, all held out by "
                            f"--validation-documents {options.validation_documents}; expected "
                            "fewer held-out documents than the corpus has")


def _stats(writers: dict, tok, tokenizer: str, input_spec: str, dtype: type, seconds: float,
           options: PreprocessOptions) -> dict:
    train = writers["train"]
    documents = sum(w.documents for w in writers.values())
    tokens = sum(w.tokens for w in writers.values())
    stats = {
        "input": input_spec, "prefix": train.prefix, "documents": train.documents,
        "tokens": train.tokens, "dtype": np.dtype(dtype).name, "tokenizer": tokenizer,
        "vocab_size": len(tok), "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
        "bos": False, "workers": options.workers, "seconds": round(seconds, 3),
        "documents_per_s": documents / max(seconds, 1e-9),
        "tokens_per_s": tokens / max(seconds, 1e-9),
    }
    if "valid" in writers:
        v = writers["valid"]
        stats["valid"] = {"prefix": v.prefix, "documents": v.documents, "tokens": v.tokens}
    return stats


def _write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def measure_preprocess_throughput(input_spec: str, tokenizer: str, workers: int = 1,
                                  batch_size: int = 1000, json_key: str = "text",
                                  max_documents: int | None = None, repeats: int = 3) -> dict:
    """Tokens/s of the full pipeline (read, encode, write ``.bin``/``.idx``) against bare
    ``tokenizer(batch)`` over the same documents, batches and worker count (best of
    ``repeats`` runs each, after imports, so one-off start-up costs are not counted).

    The bare run gets the documents already in memory, so ``ratio`` charges the pipeline for
    its I/O too. Returns ``{"documents", "tokens", "workers", "pipeline_tokens_per_s",
    "bare_tokens_per_s", "ratio"}``.
    """
    import megatron.core.datasets.indexed_dataset  # noqa: F401  (import outside the timings)

    tok = load_tokenizer(tokenizer)
    texts = [d for d in iter_documents(input_spec, json_key) if d]
    if max_documents is not None:
        texts = texts[:max_documents]
    bare_s = pipe_s = float("inf")
    opts = PreprocessOptions(json_key=json_key, workers=workers, batch_size=batch_size,
                             max_documents=max_documents, progress=False)
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        bare_tokens = sum(_map_ordered(_count_bare, _batches(texts, batch_size), tok, workers))
        bare_s = min(bare_s, time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            stats = preprocess(input_spec, tokenizer, str(Path(tmp) / "bench"), opts)
            pipe_s = min(pipe_s, time.perf_counter() - start)
    # The pipeline's count includes one EOS per document; compare like with like.
    pipe_tokens = stats["tokens"] - stats["documents"]
    pipeline = pipe_tokens / max(pipe_s, 1e-9)
    bare = bare_tokens / max(bare_s, 1e-9)
    return {"documents": stats["documents"], "tokens": pipe_tokens, "workers": workers,
            "pipeline_tokens_per_s": pipeline, "bare_tokens_per_s": bare,
            "ratio": pipeline / max(bare, 1e-9)}


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Tokenise documents into Megatron indexed datasets (P.bin/P.idx, one "
                    "sequence per document, EOS appended, no BOS).")
    ap.add_argument("--input", required=True,
                    help="local .jsonl/.json/.parquet/.txt file, folder or glob, or a HF dataset name")
    ap.add_argument("--tokenizer", required=True, help="HF hub name or local tokenizer folder")
    ap.add_argument("--output-prefix", required=True, help="writes PREFIX.bin/.idx/.stats.json")
    ap.add_argument("--json-key", default="text", help="text field of json/jsonl/parquet/HF rows")
    ap.add_argument("--workers", type=int, default=1,
                    help="encoding processes, one thread each (so N cores in all; 1: single-threaded)")
    ap.add_argument("--batch-size", type=int, default=1000, help="documents per encode batch")
    ap.add_argument("--validation-documents", type=int, default=0,
                    help=f"hold out the first N documents as PREFIX{VALID_SUFFIX}.bin/.idx")
    ap.add_argument("--max-documents", type=int, default=None)
    ap.add_argument("--text-unit", choices=("file", "line"), default="file",
                    help=".txt inputs: one document per file or per non-empty line")
    ap.add_argument("--eos-token", default=None, help="override the tokenizer's EOS token")
    hf = ap.add_argument_group("Hugging Face datasets (App. C.1: streaming, buffer 10000, seed 42)")
    hf.add_argument("--hf-config", default=None, help="dataset config, e.g. sample-350BT")
    hf.add_argument("--split", default="train")
    hf.add_argument("--streaming", action="store_true")
    hf.add_argument("--shuffle-buffer", type=int, default=10_000, help="0 disables shuffling")
    hf.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--encoding-errors", choices=ENCODING_ERRORS, default="strict",
                    help="local text that is not UTF-8: stop naming the file, line and byte (strict) or read "
                         "those bytes as U+FFFD (replace)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing PREFIX.bin/.idx")
    return ap


def check_output_prefix(prefix: str, validation: bool, overwrite: bool) -> None:
    """Before any input is read: the prefix's folder is a folder, and its files (and those of the
    ``_valid`` prefix) are not replaced without ``--overwrite``."""
    if prefix.endswith(("/", os.sep)) or Path(prefix).is_dir() or Path(prefix).name in ("", ".", ".."):
        # "data/" would write the hidden files data/.bin, data/.idx and data/.stats.json
        raise LoopDataError(f"--output-prefix {prefix}: names a folder; expected a path prefix such as "
                            f"{Path(prefix) / 'corpus'} (writes PREFIX.bin, PREFIX.idx and PREFIX.stats.json)")
    check_output_folder(Path(prefix).parent, "--output-prefix", "PREFIX.bin/.idx", given=prefix)
    names = [prefix + VALID_SUFFIX] if validation else []
    existing = [f"{p}{ext}" for p in [prefix, *names] for ext in (".bin", ".idx") if Path(f"{p}{ext}").exists()]
    if existing and not overwrite:
        raise LoopDataError(f"--output-prefix {prefix}: {' and '.join(existing)} exist; pass --overwrite to "
                            "replace them, or choose another --output-prefix")


def main(argv: Sequence[str] | None = None) -> int:
    a = build_arg_parser().parse_args(argv)
    if a.workers < 1 or a.batch_size < 1 or a.validation_documents < 0:
        raise LoopDataError("--workers and --batch-size must be >= 1, --validation-documents >= 0")
    if a.workers > host_cores():  # 1000 processes on 2 cores took 40 s instead of 6
        raise LoopDataError(f"--workers {a.workers}: expected at most the {host_cores()} CPU cores this process may "
                            "use (one encoding process per core)")
    for flag, value in (("--max-documents", a.max_documents), ("--shuffle-buffer", a.shuffle_buffer),
                        ("--seed", a.seed)):
        if value is not None and value < (1 if flag == "--max-documents" else 0):
            raise LoopDataError(f"{flag} {value}: expected an integer >= {1 if flag == '--max-documents' else 0}")
    opts = PreprocessOptions(
        json_key=a.json_key, workers=a.workers, batch_size=a.batch_size,
        validation_documents=a.validation_documents, max_documents=a.max_documents,
        text_unit=a.text_unit, eos_token=a.eos_token, progress=show_progress(not a.no_progress),
        hf=HFSource(a.input, a.hf_config, a.split, a.streaming, a.shuffle_buffer, a.seed),
        encoding_errors=a.encoding_errors)
    check_output_prefix(a.output_prefix, a.validation_documents > 0, a.overwrite)
    stats = preprocess(a.input, a.tokenizer, a.output_prefix, opts)
    print(json.dumps(stats), file=sys.stdout)
    return 0
