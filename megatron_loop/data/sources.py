"""Document sources for preprocessing: local files, folders, globs, or a Hugging Face dataset.

App. C.1: the paper streams FineWeb-Edu (``sample-350BT``) and shuffles it with a buffer of
10,000 documents and seed 42; ``iter_hf_documents`` reproduces that through ``datasets``.
Local inputs keep their file order (sorted within folders) so a run is reproducible; training
packs documents in this order (``data.order: stream``, the default) or in a further seeded
permutation (``shuffled``; see ``packed.py``).
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from megatron_loop.errors import LoopDataError, os_error_text

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
_EXPECTED = "a .jsonl/.json/.parquet/.txt file, a folder or glob of them, or a Hugging Face dataset name"


@dataclass(frozen=True)
class HFSource:
    """Where a Hugging Face dataset is read from and how it is shuffled (App. C.1 defaults)."""

    name: str
    config: str | None = None
    split: str = "train"
    streaming: bool = False
    shuffle_buffer: int = 10_000
    seed: int = 42


def _looks_local(spec: str) -> bool:
    """A spec that cannot be a hub name: explicit path syntax, glob characters or a known suffix."""
    return (spec.startswith(("/", "./", "../", "~")) or any(c in spec for c in "*?[")
            or spec.endswith(SUPPORTED_SUFFIXES))


def resolve_local_inputs(spec: str) -> list[Path] | None:
    """Files named by ``spec`` (file, folder, glob), or None when ``spec`` is a hub name.

    Raises LoopDataError when ``spec`` is clearly meant as a local path but names nothing usable.
    """
    path = Path(spec).expanduser()
    if any(c in spec for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        files = [p for p in files if p.is_file() and p.suffix in SUPPORTED_SUFFIXES]
        if not files:
            raise LoopDataError(f"input glob '{spec}' matches no files; expected {_EXPECTED}")
        return files
    if path.is_dir():
        try:
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUPPORTED_SUFFIXES)
        except OSError as e:  # --input / met /proc/1/cwd: a PermissionError traceback before
            raise LoopDataError(f"input folder '{spec}': cannot read {e.filename} ({os_error_text(e)}); expected a "
                                f"folder of {'/'.join(SUPPORTED_SUFFIXES)} files you can read") from None
        if not files:
            raise LoopDataError(f"input folder '{spec}' contains no {'/'.join(SUPPORTED_SUFFIXES)} files")
        return files
    if path.is_file():
        if path.suffix not in SUPPORTED_SUFFIXES:
            raise LoopDataError(f"input '{spec}' has unsupported suffix '{path.suffix}'; expected {_EXPECTED}")
        return [path]
    if _looks_local(spec):
        raise LoopDataError(f"input '{spec}' not found; expected {_EXPECTED}")
    return None


def _text_of(record: object, key: str, where: str) -> str:
    if not isinstance(record, dict) or key not in record:
        raise LoopDataError(f"{where}: no key '{key}' in the record; expected a JSON object with a "
                            f"string field '{key}' (set --json-key)")
    text = record[key]
    if not isinstance(text, str):
        raise LoopDataError(f"{where}: field '{key}' is {type(text).__name__}, expected a string")
    return text


ENCODING_ERRORS = ("strict", "replace")


def _decode(data: bytes, path: Path, errors: str, line: int | None = None, offset: int = 0) -> str:
    """UTF-8 text of ``data`` (bytes of ``path`` from byte ``offset``; ``line``: the line they start).
    ``errors="strict"``: a byte that is not UTF-8 stops with the file, line and byte offset;
    ``"replace"``: read as U+FFFD (the --encoding-errors flag of the tools)."""
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        at = offset + e.start
        lineno = (line or 1) + data[:e.start].count(b"\n")
        raise LoopDataError(f"{path} line {lineno}: not UTF-8 (byte 0x{data[e.start]:02x} at byte offset {at}); "
                            "expected UTF-8 text, or pass --encoding-errors replace to read such bytes as U+FFFD") \
            from None


def _iter_json_lines(path: Path, key: str, errors: str = "strict") -> Iterator[str]:
    with path.open("rb") as f:
        offset = 0
        for lineno, raw in enumerate(f, 1):
            line = _decode(raw, path, errors, lineno, offset)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise LoopDataError(f"{path} line {lineno}: invalid JSON ({e.msg}); expected one "
                                    "JSON object per line") from None
            yield _text_of(record, key, f"{path} line {lineno}")


def _iter_json(path: Path, key: str, errors: str = "strict") -> Iterator[str]:
    # A .json file is either a JSON array of records or JSON lines; peek at the first character.
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"["):
        yield from _iter_json_lines(path, key, errors)
        return
    try:
        records = json.loads(_decode(path.read_bytes(), path, errors))
    except json.JSONDecodeError as e:
        raise LoopDataError(f"{path}: invalid JSON ({e.msg}); expected an array of objects") from None
    for i, record in enumerate(records):
        yield _text_of(record, key, f"{path} item {i}")


def _iter_parquet(path: Path, key: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise LoopDataError(f"{path}: cannot read as parquet ({e})") from None
    if key not in pf.schema_arrow.names:
        raise LoopDataError(f"{path}: no column '{key}' (columns: {pf.schema_arrow.names}); "
                            "set --json-key")
    for batch in pf.iter_batches(columns=[key], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text


def _iter_txt(path: Path, text_unit: str, errors: str = "strict") -> Iterator[str]:
    text = _decode(path.read_bytes(), path, errors)
    if text_unit == "file":
        yield text
    else:
        yield from (line for line in text.splitlines() if line.strip())


def iter_local_documents(paths: Sequence[Path], json_key: str = "text",
                         text_unit: str = "file", encoding_errors: str = "strict") -> Iterator[str]:
    """Documents of ``paths`` in order. ``.txt``: one document per file (``text_unit="file"``)
    or per non-empty line (``"line"``). Text files are UTF-8; ``encoding_errors`` is ``strict``
    (one error naming the file, line and byte offset) or ``replace`` (U+FFFD)."""
    for path in paths:
        if path.suffix == ".jsonl":
            yield from _iter_json_lines(path, json_key, encoding_errors)
        elif path.suffix == ".json":
            yield from _iter_json(path, json_key, encoding_errors)
        elif path.suffix == ".parquet":
            yield from _iter_parquet(path, json_key)
        else:
            yield from _iter_txt(path, text_unit, encoding_errors)


def iter_hf_documents(source: HFSource, json_key: str = "text") -> Iterator[str]:
    """Documents of a hub dataset, shuffled as in App. C.1 (streaming: buffer of
    ``shuffle_buffer`` documents; otherwise a full shuffle; both with ``seed``)."""
    import datasets

    try:
        ds = datasets.load_dataset(source.name, source.config, split=source.split,
                                   streaming=source.streaming)
    except Exception as e:  # datasets raises many types (offline, missing config, ...)
        raise LoopDataError(f"cannot load Hugging Face dataset '{source.name}' "
                            f"(config={source.config}, split={source.split}): {e}; expected "
                            f"{_EXPECTED}") from None
    if source.shuffle_buffer > 0:
        ds = (ds.shuffle(buffer_size=source.shuffle_buffer, seed=source.seed) if source.streaming
              else ds.shuffle(seed=source.seed))
    for i, record in enumerate(ds):
        yield _text_of(record, json_key, f"{source.name}[{source.split}] row {i}")


def iter_documents(spec: str, json_key: str = "text", text_unit: str = "file",
                   hf: HFSource | None = None, encoding_errors: str = "strict") -> Iterator[str]:
    """Documents of ``spec``: local files when it names any, else the hub dataset ``spec``."""
    paths = resolve_local_inputs(spec)
    if paths is not None:
        return iter_local_documents(paths, json_key, text_unit, encoding_errors)
    return iter_hf_documents(replace(hf or HFSource(spec), name=spec), json_key)
