"""``data/sources.py``: local document sources in a reproducible order, each malformed input one error naming
the file, line and what was expected (preprocessing end to end: tests/unit/data/test_preprocess.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_loop.data.sources import iter_documents, iter_local_documents, resolve_local_inputs
from megatron_loop.errors import LoopDataError

EXPECTED = "a .jsonl/.json/.parquet/.txt file, a folder or glob of them, or a Hugging Face dataset name"


def test_folders_and_globs_are_sorted_and_filtered(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("b/2.jsonl", "a.txt", "b/1.json", "notes.md", "c.parquet"):
        (tmp_path / name).write_text("")
    assert resolve_local_inputs(str(tmp_path)) == [tmp_path / "a.txt", tmp_path / "b" / "1.json",
                                                   tmp_path / "b" / "2.jsonl", tmp_path / "c.parquet"]
    assert resolve_local_inputs(str(tmp_path / "**" / "*.json*")) == [tmp_path / "b" / "1.json",
                                                                      tmp_path / "b" / "2.jsonl"]
    assert resolve_local_inputs(str(tmp_path / "a.txt")) == [tmp_path / "a.txt"]


def test_a_hub_name_is_not_local_but_a_path_like_spec_must_exist(tmp_path):
    assert resolve_local_inputs("HuggingFaceFW/fineweb-edu") is None
    with pytest.raises(LoopDataError) as err:
        resolve_local_inputs("./missing.jsonl")
    assert str(err.value) == f"input './missing.jsonl' not found; expected {EXPECTED}"
    with pytest.raises(LoopDataError) as err:
        resolve_local_inputs(str(tmp_path / "*.jsonl"))
    assert str(err.value) == f"input glob '{tmp_path / '*.jsonl'}' matches no files; expected {EXPECTED}"
    (tmp_path / "x.md").write_text("")
    with pytest.raises(LoopDataError) as err:
        resolve_local_inputs(str(tmp_path / "x.md"))
    assert str(err.value) == f"input '{tmp_path / 'x.md'}' has unsupported suffix '.md'; expected {EXPECTED}"
    with pytest.raises(LoopDataError) as err:
        resolve_local_inputs(str(tmp_path))
    assert str(err.value) == f"input folder '{tmp_path}' contains no .jsonl/.json/.parquet/.txt files"


def test_each_format_in_file_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "1.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    (tmp_path / "2.json").write_text(json.dumps([{"body": "x"}, {"body": "y"}]))
    pq.write_table(pa.table({"text": ["p", None, "q"]}), tmp_path / "3.parquet")
    (tmp_path / "4.txt").write_text("line a\n\nline b\n")
    docs = list(iter_local_documents([tmp_path / "1.jsonl", tmp_path / "3.parquet", tmp_path / "4.txt"]))
    assert docs == ["one", "two", "p", "q", "line a\n\nline b\n"]
    assert list(iter_local_documents([tmp_path / "4.txt"], text_unit="line")) == ["line a", "line b"]
    assert list(iter_local_documents([tmp_path / "2.json"], json_key="body")) == ["x", "y"]
    assert list(iter_documents(str(tmp_path / "1.jsonl"))) == ["one", "two"]


def test_malformed_records_name_file_and_line(tmp_path):
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": 5}\n')
    with pytest.raises(LoopDataError) as err:
        list(iter_local_documents([bad]))
    assert str(err.value) == f"{bad} line 2: field 'text' is int, expected a string"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(LoopDataError) as err:
        list(iter_local_documents([bad]))
    assert str(err.value) == (f"{bad} line 1: no key 'text' in the record; expected a JSON object with a string "
                              "field 'text' (set --json-key)")
    bad.write_text('{"text": "x"}\n{oops\n')
    with pytest.raises(LoopDataError, match=rf"^{bad} line 2: invalid JSON \(.*\); expected one JSON object per line$"):
        list(iter_local_documents([bad]))
    array = tmp_path / "a.json"
    array.write_text('[{"text": "x"}, 7]')
    with pytest.raises(LoopDataError, match=rf"^{array} item 1: no key 'text' in the record"):
        list(iter_local_documents([array]))


def test_non_utf8_bytes_stop_with_the_offset_or_are_replaced(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(LoopDataError) as err:
        list(iter_local_documents([path]))
    assert str(err.value) == (f"{path} line 2: not UTF-8 (byte 0xe9 at byte offset 28); expected UTF-8 text, or "
                              "pass --encoding-errors replace to read such bytes as U+FFFD")
    assert list(iter_local_documents([path], encoding_errors="replace")) == ["ok", "caf\ufffd"]


def test_parquet_without_the_column_lists_the_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(LoopDataError) as err:
        list(iter_local_documents([Path(tmp_path / "p.parquet")]))
    assert str(err.value) == f"{tmp_path / 'p.parquet'}: no column 'text' (columns: ['body']); set --json-key"
