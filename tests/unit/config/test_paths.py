"""``config/paths.py``: indexed-dataset prefixes, the validation sibling, and a config's relative paths made
absolute (the tools that read a run config back from another folder: tests/integration/cli/)."""

from __future__ import annotations

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.config.deepspeed import CONFIG_DIR
from megatron_loop.config.paths import VALID_SUFFIX, prefix_exists, resolve_paths, sibling_valid_prefix
from megatron_loop.errors import LoopConfigError


def _prefix(folder, name, exts=(".bin", ".idx")):
    for ext in exts:
        (folder / f"{name}{ext}").write_bytes(b"x")
    return str(folder / name)


def test_a_prefix_exists_when_either_file_does(tmp_path):
    assert not prefix_exists(tmp_path / "d")
    (tmp_path / "d").write_text("the prefix itself is no dataset")
    assert not prefix_exists(tmp_path / "d")
    (tmp_path / "d.idx").write_bytes(b"")
    assert prefix_exists(tmp_path / "d")


def test_the_validation_sibling_is_found_only_when_written(tmp_path):
    train = _prefix(tmp_path, "corpus")
    assert sibling_valid_prefix(train) is None
    _prefix(tmp_path, "corpus" + VALID_SUFFIX)
    assert sibling_valid_prefix(train) == train + "_valid"


def test_relative_paths_that_exist_are_made_absolute_and_missing_ones_stay(tmp_path):
    _prefix(tmp_path, "a")
    _prefix(tmp_path, "v")
    (tmp_path / "tok").mkdir()
    (tmp_path / "ds.json").write_text("{}")
    cfg = config_from_dict({"data": {"train_prefixes": ["a", "missing"], "valid_prefixes": ["v"], "tokenizer": "tok"},
                            "train": {"deepspeed_config": "ds.json"}})
    assert resolve_paths(cfg, tmp_path) is cfg
    assert cfg.data.train_prefixes == [str(tmp_path / "a"), "missing"]  # the check that reports it names "missing"
    assert cfg.data.valid_prefixes == [str(tmp_path / "v")]
    assert cfg.data.tokenizer == str(tmp_path / "tok")
    assert cfg.train.deepspeed_config == str(tmp_path / "ds.json")


def test_a_hub_tokenizer_and_the_shipped_deepspeed_config_are_kept_apart(tmp_path):
    cfg = config_from_dict({"data": {"train_prefixes": ["a"], "tokenizer": "gpt2"},
                            "train": {"deepspeed_config": "deepspeed_configs/zero1.json"}})
    resolve_paths(cfg, tmp_path)
    assert cfg.data.tokenizer == "gpt2"  # not a local path: a hub name
    assert cfg.train.deepspeed_config == str(CONFIG_DIR / "zero1.json")  # the repository's shipped file


def test_two_spellings_of_one_prefix_are_refused_once_resolved(tmp_path):
    _prefix(tmp_path, "a")
    cfg = config_from_dict({"data": {"train_prefixes": ["a", str(tmp_path / "a")]}})
    with pytest.raises(LoopConfigError) as err:
        resolve_paths(cfg, tmp_path)
    assert str(err.value) == (f"data.train_prefixes[1]={str(tmp_path / 'a')!r}: listed twice; expected each prefix "
                              "once (data.train_weights sets how much of each is read)")
