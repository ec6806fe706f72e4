"""The data and config tools on inputs an operator gets wrong: text that is not UTF-8 (file, line,
byte offset; ``--encoding-errors replace`` reads it), an output path that is an existing file, an
existing indexed prefix (kept unless ``--overwrite``), ``generate_configs.py --commands`` without
``--study`` (examples/ untouched) and ``--list-configs | head`` (no BrokenPipeError). Each error is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_fixtures import REPO, data_assets
from megatron_loop.cli import run_cli
from train_fixtures import env

BAD = "caf\xe9".encode("latin-1")  # 0xe9 alone is not UTF-8


def _tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda argv: run_cli(module.main, argv)  # as the script's __main__ runs it


def _jsonl_with_bad_line(path: Path) -> Path:
    path.write_bytes(b'{"text": "first document"}\n{"text": "second"}\n{"text": "' + BAD + b'"}\n')
    return path


def _errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_preprocess_names_file_line_and_byte_and_replace_reads_it(tmp_path, capsys):
    from megatron_loop.data.preprocess import main

    src = _jsonl_with_bad_line(tmp_path / "docs.jsonl")
    prefix = tmp_path / "out" / "p"
    args = ["--input", str(src), "--tokenizer", str(data_assets().tokenizer), "--output-prefix", str(prefix),
            "--no-progress"]
    assert run_cli(main, args) == 2
    offset = len(b'{"text": "first document"}\n{"text": "second"}\n{"text": "caf')
    assert _errors(capsys) == [f"error: {src} line 3: not UTF-8 (byte 0xe9 at byte offset {offset}); expected UTF-8 "
                               "text, or pass --encoding-errors replace to read such bytes as U+FFFD"]
    assert not list(prefix.parent.glob("p*"))  # nothing half-written
    assert run_cli(main, [*args, "--encoding-errors", "replace"]) == 0
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    assert len(IndexedDataset(str(prefix))) == 3


def test_preprocess_keeps_an_existing_prefix_unless_overwrite(tmp_path, capsys):
    from megatron_loop.data.preprocess import main

    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "one"}\n{"text": "two"}\n')
    prefix = tmp_path / "p"
    for ext in (".bin", ".idx"):
        Path(f"{prefix}{ext}").write_bytes(b"precious")
    args = ["--input", str(src), "--tokenizer", str(data_assets().tokenizer), "--output-prefix", str(prefix),
            "--no-progress"]
    assert run_cli(main, args) == 2
    assert _errors(capsys) == [f"error: --output-prefix {prefix}: {prefix}.bin and {prefix}.idx exist; pass "
                               "--overwrite to replace them, or choose another --output-prefix"]
    assert Path(f"{prefix}.bin").read_bytes() == b"precious"
    assert run_cli(main, [*args, "--overwrite"]) == 0 and Path(f"{prefix}.bin").read_bytes() != b"precious"
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run_cli(main, ["--input", str(src), "--tokenizer", str(data_assets().tokenizer),
                          "--output-prefix", str(afile / "p")]) == 2
    assert _errors(capsys) == [f"error: --output-prefix {afile / 'p'}: {afile} is a file; expected a folder for "
                               "PREFIX.bin/.idx"]


def test_train_tokenizer_non_utf8_and_output_file(tmp_path, capsys):
    main = _tool("train_tokenizer")
    src = tmp_path / "notes.txt"
    src.write_bytes(b"line one\nline two " + BAD + b"\n")
    assert main(["--input", str(src), "--output", str(tmp_path / "tok")]) == 2
    assert _errors(capsys) == [f"error: {src} line 2: not UTF-8 (byte 0xe9 at byte offset 21); expected UTF-8 text, "
                               "or pass --encoding-errors replace to read such bytes as U+FFFD"]
    assert not (tmp_path / "tok").exists()
    afile = tmp_path / "tok_file"
    afile.write_text("mine")
    assert main(["--input", str(src), "--output", str(afile), "--encoding-errors", "replace"]) == 2
    assert _errors(capsys) == [f"error: --output {afile}: exists and is not a folder; expected a folder for the "
                               "tokenizer files"]
    assert afile.read_text() == "mine"
    assert main(["--input", str(src), "--output", str(tmp_path / "tok"), "--encoding-errors", "replace",
                 "--vocab-size", "300"]) == 0
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_make_corpus_output_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "corpus"
    afile.write_text("mine")
    assert _tool("make_corpus")(["--output-dir", str(afile)]) == 2
    assert _errors(capsys) == [f"error: --output-dir {afile}: exists and is not a folder; expected a folder for the "
                               "corpus files"]
    assert afile.read_text() == "mine"


@pytest.mark.parametrize("flags", [["--commands"], ["--toy-dir", "somewhere"]])
def test_generate_configs_study_flags_without_study_leave_examples_alone(flags, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in (REPO / "examples").rglob("*")}  # examples/paper/ too
    r = subprocess.run([sys.executable, str(REPO / "tools" / "generate_configs.py"), *flags], cwd=tmp_path,
                       env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == (f"generate_configs.py: error: {flags[0]}: only with --study NAME "
                                         "(see --list-studies)")
    assert {p: p.stat().st_mtime_ns for p in (REPO / "examples").rglob("*")} == before
    assert not (tmp_path / "somewhere").exists()


def test_list_configs_into_a_closed_pipe_exits_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, str(REPO / "pretrain_loop.py"), "--list-configs"], cwd=tmp_path,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"name ")  # like `| head -1`: read a line, close the pipe
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "BrokenPipeError" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("form", ["trailing_separator", "existing_folder"])
def test_preprocess_refuses_a_prefix_that_names_a_folder(tmp_path, capsys, form):
    """Before: ``--output-prefix bad/data/`` wrote the hidden files bad/data/.bin, .idx, .stats.json."""
    from megatron_loop.data.preprocess import main

    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "one"}\n')
    folder = tmp_path / "bad" / "data"
    folder.mkdir(parents=True)
    prefix = f"{folder}/" if form == "trailing_separator" else str(folder)
    args = ["--input", str(src), "--tokenizer", str(data_assets().tokenizer), "--output-prefix", prefix]
    assert run_cli(main, args) == 2
    assert _errors(capsys) == [f"error: --output-prefix {prefix}: names a folder; expected a path prefix such as "
                               f"{folder / 'corpus'} (writes PREFIX.bin, PREFIX.idx and PREFIX.stats.json)"]
    assert not list(folder.iterdir()) and sorted(p.name for p in folder.parent.iterdir()) == ["data"]


def test_special_token_text_in_a_document_stays_text(tmp_path):
    """Before: a literal <|endoftext|> in a document became the EOS id inside it (a document boundary
    the packing and the loss then saw). Now only the appended EOS is one; the text decodes back."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from transformers import AutoTokenizer

    from megatron_loop.data.preprocess import PreprocessOptions, preprocess

    texts = ["the tag <|endoftext|> is text here", "a plain one"]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    preprocess(str(src), str(data_assets().tokenizer), str(tmp_path / "p"), PreprocessOptions(progress=False))
    tok = AutoTokenizer.from_pretrained(data_assets().tokenizer)
    data = IndexedDataset(str(tmp_path / "p"))
    for i, text in enumerate(texts):
        ids = data[i].tolist()
        assert [j for j, t in enumerate(ids) if t == tok.eos_token_id] == [len(ids) - 1]  # the appended EOS only
        assert tok.decode(ids[:-1]) == text
    assert len(data[0]) > len(tok(texts[0], add_special_tokens=False)["input_ids"]) + 1  # the tag spelled out


def test_train_tokenizer_says_when_the_corpus_gives_fewer_tokens_than_asked(tmp_path, capsys):
    """Before: --vocab-size 4096 gave 1,265 tokens without a word (model.vocab_size then set from the flag)."""
    from tokenizers import Tokenizer

    src = tmp_path / "notes.txt"
    src.write_text("the cat sat on the mat\nthe dog sat on the log\n")
    assert _tool("train_tokenizer")(["--input", str(src), "--output", str(tmp_path / "tok"), "--vocab-size", "4096"]) == 0
    got = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json")).get_vocab_size()
    assert 257 < got < 4096
    assert _errors(capsys) == [f"note: --vocab-size 4,096: the corpus gave {got:,} tokens (no more pairs seen at least "
                               f"twice), so the tokenizer has {got:,}; model.vocab_size must be >= {got:,}"]
