"""``registry/render.py``: the YAML text of a generated config: scalars as YAML reads them back, sections in
order with their comments, the parameters line (every generated file current: tests/unit/registry/
test_registry.py)."""

from __future__ import annotations

import pytest
import yaml

from megatron_loop.registry import RUNS
from megatron_loop.registry.render import dump_yaml, parameters_line, yaml_scalar


@pytest.mark.parametrize("value, text", [
    (True, "true"), (None, "null"), (0.0, "0.0"), (3.0e-3, "3.0e-3"), (1.33847e-3, "1.33847e-3"),
    (0.05, "0.05"), (1e-9, "1.0e-9"), (2048, "2048"), ([1, 0.001, None], "[1, 1.0e-3, null]"), ("zero1", "zero1"),
])
def test_scalars_read_back_as_written(value, text):
    assert yaml_scalar(value) == text
    assert yaml.safe_load(f"k: {text}")["k"] == value  # YAML 1.1 needs the dot in 1.0e-3 to read a float


def test_sections_in_order_with_header_and_inline_comments():
    text = dump_yaml({"model": {"core_layers": 4}, "train": {"lr": 1.8e-3, "seed": 42}}, ["A run", ""],
                     {("train", "lr"): "one peak lr"})
    assert text == ("# A run\n#\nmodel:\n  core_layers: 4\ntrain:\n  lr: 1.8e-3  # one peak lr\n  seed: 42\n")
    assert yaml.safe_load(text) == {"model": {"core_layers": 4}, "train": {"lr": 1.8e-3, "seed": 42}}


def test_parameters_line():
    assert parameters_line(RUNS["qwen_4x7"]) == "Paper parameters: 218,507,264 (Table 2, unconditioned)."
    assert parameters_line(RUNS["qwen_2x14"]) == "Paper parameters: about 187,050,000 (App. C.1, unconditioned)."
    assert parameters_line(RUNS["qwen_4x7_hist_dense_w2"]) == (
        "Paper parameters: 218,507,264 (Table 2, unconditioned) + 2,097,152 conditioning (App. C.1).")  # w d^2
    assert parameters_line(RUNS["pilot_baseloop_3x4_muon"]).startswith("Parameters: the paper gives none")
