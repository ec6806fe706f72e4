"""Preprocessing: round trip through megatron-core, input formats, atomic writes, bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_fixtures import REPO, data_assets, run_tool, write_jsonl
from megatron_loop.data.preprocess import PreprocessOptions, measure_preprocess_throughput, preprocess
from megatron_loop.data.sources import iter_documents
from megatron_loop.errors import LoopDataError

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)

DOCS = ["Hello world.", "Ünïcödé text — with “quotes” and emoji 🙂.", "  leading spaces\nand lines\n",
        "x", "The last document has a tab\there."]


def _read_back(prefix: str) -> list[np.ndarray]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    assert len(ds.document_indices) == len(ds) + 1  # one sequence per document
    return [np.array(ds[i]) for i in range(len(ds))]  # copies: ds closes its mmap when freed


def _options(**kw) -> PreprocessOptions:
    return PreprocessOptions(progress=False, **kw)


def test_round_trip_decodes_to_documents_plus_eos(tmp_path):
    from transformers import AutoTokenizer

    a = data_assets()
    tok = AutoTokenizer.from_pretrained(str(a.tokenizer))
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    stats = preprocess(str(src), str(a.tokenizer), str(tmp_path / "out" / "p"), _options(workers=2, batch_size=2))
    seqs = _read_back(str(tmp_path / "out" / "p"))
    assert [tok.decode(s) for s in seqs] == [d + tok.eos_token for d in DOCS]
    assert all(s[-1] == tok.eos_token_id and (s[:-1] != tok.eos_token_id).all() for s in seqs)
    assert seqs[0].dtype == np.uint16  # vocabulary of 600 fits
    assert stats["documents"] == len(DOCS) and stats["tokens"] == sum(map(len, seqs))
    on_disk = json.loads((tmp_path / "out" / "p.stats.json").read_text())
    assert on_disk["dtype"] == "uint16" and on_disk["tokenizer"] == str(a.tokenizer)
    assert not list((tmp_path / "out").glob("*.tmp*")), "temporary files left behind"


def test_validation_prefix_holds_first_documents(tmp_path):
    a = data_assets()
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    stats = preprocess(str(src), str(a.tokenizer), str(tmp_path / "p"), _options(validation_documents=2, batch_size=1))
    full = preprocess(str(src), str(a.tokenizer), str(tmp_path / "full"), _options())
    all_seqs = _read_back(str(tmp_path / "full"))
    valid, train = _read_back(str(tmp_path / "p_valid")), _read_back(str(tmp_path / "p"))
    assert [s.tolist() for s in valid + train] == [s.tolist() for s in all_seqs]
    assert stats["valid"]["documents"] == 2 and stats["documents"] == 3 and full["documents"] == 5


def test_workers_give_identical_output(tmp_path):
    a = data_assets()
    for workers in (1, 2):
        preprocess(str(a.corpus / "valid.jsonl"), str(a.tokenizer), str(tmp_path / f"w{workers}"),
                   _options(workers=workers, batch_size=7))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"w1{suffix}").read_bytes() == (tmp_path / f"w2{suffix}").read_bytes()


def test_input_formats_folders_and_globs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "in"
    write_jsonl(d / "a.jsonl", DOCS[:2], key="content")
    (d / "b.json").write_text(json.dumps([{"content": DOCS[2]}]), encoding="utf-8")
    pq.write_table(pa.table({"content": [DOCS[3]]}), d / "c.parquet")
    (d / "sub").mkdir()
    (d / "sub" / "d.txt").write_text(DOCS[4], encoding="utf-8")
    (d / "notes.md").write_text("ignored: unsupported suffix")
    assert list(iter_documents(str(d), json_key="content")) == DOCS
    assert list(iter_documents(str(d / "*.json*"), json_key="content")) == DOCS[:3]
    assert list(iter_documents(str(d / "sub" / "d.txt"), text_unit="line")) == ["The last document has a tab\there."]


def test_validation_cannot_take_every_document(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    with pytest.raises(LoopDataError, match=rf"input '{src}' has 5 documents, all held out by "
                                            r"--validation-documents 9"):
        preprocess(str(src), str(data_assets().tokenizer), str(tmp_path / "p"), _options(validation_documents=9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_max_documents_and_empty_documents_skipped(tmp_path):
    a = data_assets()
    src = write_jsonl(tmp_path / "in.jsonl", ["", DOCS[0], "", DOCS[1], DOCS[2]])
    stats = preprocess(str(src), str(a.tokenizer), str(tmp_path / "p"), _options(max_documents=2))
    assert stats["documents"] == 2


def test_failed_run_leaves_no_files(tmp_path):
    a = data_assets()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"other": "no text"}) + "\n")
    with pytest.raises(LoopDataError, match=r"in\.jsonl line 2: no key 'text'"):
        preprocess(str(src), str(a.tokenizer), str(tmp_path / "out" / "p"), _options(workers=2, batch_size=1))
    assert list((tmp_path / "out").iterdir()) == []


def test_hub_name_offline_gives_clear_error(tmp_path, monkeypatch):
    a = data_assets()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoopDataError, match="cannot load Hugging Face dataset 'no-such-org/no-such-dataset'"):
        preprocess("no-such-org/no-such-dataset", str(a.tokenizer), str(tmp_path / "p"), _options())


def test_main_writes_prefix_and_prints_stats(tmp_path, capsys):
    from megatron_loop.data.preprocess import main

    a = data_assets()
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    assert main(["--input", str(src), "--tokenizer", str(a.tokenizer), "--output-prefix",
                 str(tmp_path / "p"), "--workers", "2", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["documents"] == len(DOCS)
    assert len(_read_back(str(tmp_path / "p"))) == len(DOCS)


def test_cli_missing_input(tmp_path):
    missing = tmp_path / "nope.jsonl"
    bad = run_tool("preprocess_data.py", "--input", str(missing), "--tokenizer", "unused",
                   "--output-prefix", str(tmp_path / "q"))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        f"error: input '{missing}' not found; expected a .jsonl/.json/.parquet/.txt file, a folder "
        "or glob of them, or a Hugging Face dataset name")
    assert not any(tmp_path.iterdir())


def test_cli_empty_corpus(tmp_path):
    a = data_assets()
    src = write_jsonl(tmp_path / "empty.jsonl", ["", ""])
    r = run_tool("preprocess_data.py", "--input", str(src), "--tokenizer", str(a.tokenizer),
                 "--output-prefix", str(tmp_path / "p"))
    assert r.returncode == 2
    assert f"error: input '{src}' contains no non-empty documents" in r.stderr
    assert not any(tmp_path.glob("p*"))


def test_cli_tokenizer_without_eos(tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    a = data_assets()
    raw = Tokenizer.from_file(str(a.tokenizer / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(str(tmp_path / "tok_no_eos"))
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    r = run_tool("preprocess_data.py", "--input", str(src), "--tokenizer", str(tmp_path / "tok_no_eos"),
                 "--output-prefix", str(tmp_path / "p"))
    assert r.returncode == 2
    assert f"error: tokenizer '{tmp_path / 'tok_no_eos'}' has no EOS token" in r.stderr


def test_measure_preprocess_throughput_reports_both_rates():
    a = data_assets()
    m = measure_preprocess_throughput(str(a.corpus / "valid.jsonl"), str(a.tokenizer), workers=1,
                                      batch_size=16, repeats=1)
    assert m["documents"] == 60 and m["tokens"] > 0
    assert m["pipeline_tokens_per_s"] > 0 and m["bare_tokens_per_s"] > 0
    assert m["ratio"] == pytest.approx(m["pipeline_tokens_per_s"] / m["bare_tokens_per_s"])


def test_hf_streaming_path_shuffles_with_buffer_and_seed(tmp_path, monkeypatch):
    """The hub code path (App. C.1: streaming, buffer shuffle, seed 42) on a local folder, which
    ``datasets.load_dataset`` accepts like a hub name but without a network."""
    import datasets

    from megatron_loop.data.sources import HFSource, iter_hf_documents

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    texts = [f"document number {i}" for i in range(40)]
    write_jsonl(tmp_path / "hub" / "train.jsonl", texts)
    name = str(tmp_path / "hub")
    shuffled = list(iter_hf_documents(HFSource(name, streaming=True, shuffle_buffer=10, seed=42)))
    assert sorted(shuffled) == sorted(texts) and shuffled != texts
    assert shuffled == list(iter_hf_documents(HFSource(name, streaming=True, shuffle_buffer=10, seed=42)))
    assert shuffled != list(iter_hf_documents(HFSource(name, streaming=True, shuffle_buffer=10, seed=1)))
    assert list(iter_hf_documents(HFSource(name, streaming=True, shuffle_buffer=0))) == texts
    with pytest.raises(LoopDataError, match=rf"{name}\[train\] row 0: no key 'body'"):
        next(iter_hf_documents(HFSource(name, streaming=True), json_key="body"))


def test_large_vocabulary_uses_int32(tmp_path, monkeypatch):
    """Llama-3.1/Qwen3 vocabularies (128,256 / 151,936, App. C.1) do not fit uint16."""
    import megatron_loop.data.preprocess as pp
    from megatron_loop.data.tokenizer import load_tokenizer

    class LargeVocab:
        def __init__(self, tok):
            self.tok, self.eos_token, self.eos_token_id = tok, tok.eos_token, tok.eos_token_id

        def __len__(self):
            return 151_936

        def __call__(self, *args, **kwargs):
            return self.tok(*args, **kwargs)

    monkeypatch.setattr(pp, "load_tokenizer", lambda name, eos=None: LargeVocab(load_tokenizer(name)))
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    stats = pp.preprocess(str(src), str(data_assets().tokenizer), str(tmp_path / "p"), _options())
    seqs = _read_back(str(tmp_path / "p"))
    assert stats["dtype"] == "int32" and seqs[0].dtype == np.int32
    assert stats["tokens"] == sum(map(len, seqs))


@pytest.mark.parametrize("name,message", [
    ("{tmp}/no/tokenizer", "error: --tokenizer {tmp}/no/tokenizer: no such folder; expected a tokenizer folder "
                           "saved with save_pretrained (or a hub name such as meta-llama/Llama-3.1-8B)"),
    # a name the hub could hold: tried there, offline here, and still one line
    ("runs/tokenizer", "error: --tokenizer runs/tokenizer: no such folder, and cannot load a tokenizer (We couldn't "
                       "connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
                       "files); expected a folder saved with save_pretrained or a Hugging Face hub name"),
])
def test_cli_tokenizer_path_missing(tmp_path, capsys, monkeypatch, name, message):
    import huggingface_hub

    from megatron_loop.cli import run_cli
    from megatron_loop.data.preprocess import main

    monkeypatch.chdir(tmp_path)  # "runs/tokenizer" is looked up relative to here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # what `make test` sets
    src = write_jsonl(tmp_path / "in.jsonl", DOCS)
    args = ["--input", str(src), "--tokenizer", name.format(tmp=tmp_path), "--output-prefix", str(tmp_path / "p")]
    assert run_cli(main, args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message.format(tmp=tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# Threads of a fresh process before and after encoding the fixture corpus 20 times over through the
# pipeline's encoder (``workers`` 1), then after the tokenizer's own batch call (the control: its Rust
# thread pool starts one thread per core).
_THREADS = """
import json, os, sys
from transformers import AutoTokenizer
from megatron_loop.data.preprocess import _batches, _map_ordered, encode_batch
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = [json.loads(line)["text"] for line in open(sys.argv[2])] * 20
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
list(_map_ordered(encode_batch, _batches(texts, 64), tok, 1))
after = threads()
variable = os.environ.get("TOKENIZERS_PARALLELISM")
tok(texts)
print(before, after, variable, threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts the threads of a process in /proc on a machine with several cores")
def test_one_worker_encodes_on_one_thread():
    """``--workers 1`` is single-threaded: the tokenizer's Rust pool (one thread per core, which its
    batch call starts otherwise) never starts, and TOKENIZERS_PARALLELISM is restored afterwards."""
    a = data_assets()
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    out = subprocess.run([sys.executable, "-c", _THREADS, str(a.tokenizer), str(a.corpus / "valid.jsonl")],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, variable, control = out.stdout.split()
    assert after == before and variable == "None"
    assert int(control) > int(after)  # the control: the measurement sees the pool when it starts
