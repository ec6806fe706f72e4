"""``config/yaml_reader.py``: a config's YAML is plain data or one error naming the key. Alias bombs
and recursive aliases are refused before they are expanded (in well under a second), dates and
YAML 1.1's base-60 numbers stay strings for the typed check to name, explicit tags that build
something else (``!!binary``, ``!!set``, ...) and complex or non-string keys are refused, merge
keys work, and ``--set`` values are read by the same rules."""

from __future__ import annotations

import time

import pytest

from megatron_loop import LoopConfigError, load_config
from megatron_loop.config.yaml_reader import MAX_VALUES, read_yaml
from testpaths import REPO

TINY = REPO / "examples" / "tiny_2x3.yaml"


def _bomb(levels: int = 9) -> str:
    """The "billion laughs": nine aliases of nine, ``levels`` deep (9^10 strings once expanded)."""
    lines = ["data:", '  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _error(tmp_path, text: str, overrides=()) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(LoopConfigError) as err:
        load_config(path, list(overrides))
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message[len(f"{path}: "):]


def test_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    start = time.perf_counter()
    message = _error(tmp_path, _bomb())
    assert time.perf_counter() - start < 2  # expanding it would take minutes and gigabytes
    assert message.startswith(f"data.l5: its aliases expand it to more than {MAX_VALUES:,} values (line 7; ")
    assert "billion laughs" in message


def test_shared_values_below_the_bound_are_read():
    value = read_yaml("a: &x [1, 2, 3]\nb: [*x, *x]\n")
    assert value == {"a": [1, 2, 3], "b": [[1, 2, 3], [1, 2, 3]]}
    assert read_yaml(_bomb(levels=3))["data"]["l3"][8][8][8] == ["lol"] * 9  # 9^4 = 6,561 values: fine


def test_recursive_alias_names_the_key(tmp_path):
    assert _error(tmp_path, "model: &a {self: *a}\n") == (
        "model.self: an alias to a value that contains it (line 1, a recursive alias); expected a value that "
        "does not contain itself")
    assert _error(tmp_path, "data:\n  train_prefixes: &p [a, *p]\n").startswith("data.train_prefixes[1]: an alias")


@pytest.mark.parametrize("text,message", [
    ("train: {seed: 2024-01-01}\n", "train.seed='2024-01-01': expected an integer"),  # a date stays a string
    ("train:\n  max_steps: 1:30\n", "train.max_steps='1:30': expected int or null"),  # not 90 (base 60)
    ("train:\n  seed: !!binary aGVsbG8=\n", "train.seed: a YAML !!binary value; expected a string, number, "
                                             "boolean, list or mapping"),
    ("train:\n  seed: !!timestamp 2024-01-01\n", "train.seed: a YAML !!timestamp value;"),
    ("data:\n  train_prefixes: !!set {a, b}\n", "data.train_prefixes: a YAML !!set value;"),
    ("data:\n  train_prefixes: !!omap [{a: 1}]\n", "data.train_prefixes[0]: a YAML !!omap or !!pairs value;"),
    ("train:\n  ? [a, b]\n  : 1\n", "a complex key (a list) at line 2; expected a name"),
    ("train:\n  1: 2\n", "key '1' at line 2 reads as a int in YAML; expected a name (quote it)"),
    ("train:\n  seed: 1\n  seed: 2\n", "duplicate key 'seed' at line 3 (first at line 2)"),
    ("model: {recompute: off}\n",
     "model.recompute=False: expected one of ('none', 'per_loop', 'selective', 'auto', 'per_block') "
     "(YAML reads an unquoted on/off/yes/no as a boolean: quote it)"),
    ("model: {history_injection: no}\n", "model.history_injection=False: expected one of ('none', 'scalar', "),
])
def test_yaml_that_is_not_plain_config_data_is_one_error(tmp_path, text, message):
    assert message in _error(tmp_path, text)


def test_merge_keys_are_supported_and_own_keys_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  <<: {backbone: tiny-llama, core_layers: 3, train_loops: 5}\n  core_layers: 2\n"
                    "train:\n  <<: [{max_steps: 7}, {seed: 3}]\n")
    cfg = load_config(path)
    assert (cfg.model.backbone, cfg.model.core_layers, cfg.model.train_loops) == ("tiny-llama", 2, 5)
    assert (cfg.train.max_steps, cfg.train.seed) == (7, 3)


def test_set_values_follow_the_same_rules():
    with pytest.raises(LoopConfigError, match=r"train\.max_steps='1:30': expected int or null"):
        load_config(TINY, ["train.max_steps=1:30"])
    with pytest.raises(LoopConfigError, match=r"--set 'train.seed=!!binary aGk=': train\.seed: a YAML !!binary"):
        load_config(TINY, ["train.seed=!!binary aGk="])
    # integers written as 1e9 (YAML 1.1 reads them as strings) are the numbers they spell
    assert load_config(TINY, ["train.train_tokens=2.5e6", "train.max_steps=null"]).train.train_tokens == 2_500_000
    with pytest.raises(LoopConfigError, match=r"train\.train_tokens='2\.5e0': expected int or null"):
        load_config(TINY, ["train.train_tokens=2.5e0"])


def test_set_of_one_key_of_a_preset_mapping_updates_it():
    """``--set model.rope_scaling.factor=4`` changes the factor of the backbone's llama3 rule (before:
    it replaced the whole rule with {factor: 4}); null still removes it."""
    preset = load_config(TINY).model.rope_scaling
    cfg = load_config(TINY, ["model.rope_scaling.factor=4"])
    assert cfg.model.rope_scaling == {**preset, "factor": 4}
    assert load_config(TINY, ["model.rope_scaling=null"]).model.rope_scaling is None
