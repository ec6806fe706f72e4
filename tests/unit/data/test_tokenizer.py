"""``data/tokenizer.py``: the local byte-level BPE, loading with one-line errors, and a folder's
fingerprint (the tools that use them: tests/integration/cli/test_tool_inputs.py)."""

from __future__ import annotations

import pytest

from megatron_loop.data.tokenizer import (EOS_TOKEN, MAX_VOCAB_SIZE, check_tokenizer_location, load_tokenizer,
                                          open_tokenizer, tokenizer_fingerprint, train_bpe_tokenizer)
from megatron_loop.errors import LoopDataError

TEXTS = ["the cat sat on the mat", "a dog ate the bone", "héllo wörld  twice  spaced\n"] * 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return train_bpe_tokenizer(TEXTS, tmp_path_factory.mktemp("tok"), vocab_size=300)


def test_trained_bpe_round_trips_bytes_and_has_eos_zero(folder):
    tok = load_tokenizer(str(folder))
    assert tok.is_fast and tok.eos_token == EOS_TOKEN and tok.eos_token_id == 0
    assert len(tok) <= 300
    for text in TEXTS[:3]:
        assert tok.decode(tok.encode(text)) == text  # no prefix space, no normalisation
    assert "is_local" not in tok.init_kwargs and "local_files_only" not in tok.init_kwargs


def test_vocab_size_bounds_and_an_empty_corpus(tmp_path):
    with pytest.raises(LoopDataError, match=r"^vocab_size 257 too small; byte-level BPE needs at least 258 "):
        train_bpe_tokenizer(TEXTS, tmp_path, vocab_size=257)
    with pytest.raises(LoopDataError) as err:
        train_bpe_tokenizer(TEXTS, tmp_path, vocab_size=MAX_VOCAB_SIZE + 1)
    assert str(err.value).startswith("vocab_size 1,048,577: expected at most 1,048,576 (2^20;")
    with pytest.raises(LoopDataError) as err:
        train_bpe_tokenizer([], tmp_path / "empty", vocab_size=300)
    assert str(err.value) == "no documents to train the tokenizer on; expected a non-empty corpus"


def test_eos_override_must_be_in_the_vocabulary(folder):
    with pytest.raises(LoopDataError) as err:
        load_tokenizer(str(folder), eos_token="<eos>")
    assert str(err.value) == f"tokenizer '{folder}' has no token '<eos>' (given as the EOS token)"
    assert load_tokenizer(str(folder), eos_token=EOS_TOKEN).eos_token_id == 0


def test_a_mistyped_folder_and_a_file_are_one_line_errors(folder, tmp_path):
    with pytest.raises(LoopDataError) as err:
        check_tokenizer_location(str(tmp_path / "no" / "such"), source="data.tokenizer in run.yaml")
    assert str(err.value) == ("data.tokenizer in run.yaml: no such folder; expected a tokenizer folder saved with "
                              "save_pretrained (or a hub name such as meta-llama/Llama-3.1-8B)")
    check_tokenizer_location("meta-llama/Llama-3.1-8B")  # a possible hub id passes (nothing is downloaded)
    stray = tmp_path / "vocab.txt"
    stray.write_text("x")
    with pytest.raises(LoopDataError, match=r"^--tokenizer .*vocab.txt: a file, not a tokenizer folder; "):
        open_tokenizer(str(stray))
    assert open_tokenizer(str(folder / "tokenizer.json")).eos_token_id == 0  # its folder's tokenizer


def test_fingerprint_changes_with_the_files(folder, tmp_path):
    assert tokenizer_fingerprint(None) is None
    assert tokenizer_fingerprint("gpt2") == {"name": "gpt2", "sha256": None}
    first = tokenizer_fingerprint(str(folder))
    assert first["name"] == str(folder) and len(first["sha256"]) == 64
    assert tokenizer_fingerprint(str(folder)) == first
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in folder.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    assert tokenizer_fingerprint(str(copy))["sha256"] == first["sha256"]  # the bytes, not the place
    (copy / "tokenizer.json").write_bytes((copy / "tokenizer.json").read_bytes() + b" ")
    assert tokenizer_fingerprint(str(copy))["sha256"] != first["sha256"]
