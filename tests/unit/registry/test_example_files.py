"""``registry/example_files.py``: where each generated config lives and the index of them (the files on disk
match it: tools/generate_configs.py --check in tests/unit/registry/test_registry.py)."""

from __future__ import annotations

import collections
import re
from pathlib import PurePosixPath

from data_fixtures import REPO
from megatron_loop import registry
from megatron_loop.registry.example_files import INDEX, example_path, generated_files


def test_generated_configs_are_laid_out_by_family_and_experiment():
    """The README's two runs at the top of examples/, every other run in the folder of its
    experiment, and the index links every config once, to a file that exists."""
    path = registry.example_path
    assert [str(path(n)) for n in ("llama_4x5", "qwen_4x7")] == ["examples/llama_4x5.yaml", "examples/qwen_4x7.yaml"]
    assert str(path("llama_20x1")) == "examples/paper/llama/layouts/llama_20x1.yaml"
    assert str(path("qwen_0+2x13+2")) == "examples/paper/qwen/layouts/qwen_0+2x13+2.yaml"
    assert str(path("llama_2x10_init_dense")) == "examples/paper/llama/initial_injection/llama_2x10_init_dense.yaml"
    assert str(path("qwen_4x7_init_channel+noise")) == (
        "examples/paper/qwen/initial_injection/qwen_4x7_init_channel+noise.yaml")
    assert str(path("qwen_4x7_hist_dense_w4")) == "examples/paper/qwen/history_injection/qwen_4x7_hist_dense_w4.yaml"
    assert str(path("llama_5x4_adaln")) == "examples/paper/llama/timestep/llama_5x4_adaln.yaml"
    assert str(path("qwen_4x7_hist_dense_w1+bg")) == "examples/paper/qwen/combinations/qwen_4x7_hist_dense_w1+bg.yaml"
    assert str(path("pilot_huginn_1+2x5+1_muon")) == "examples/paper/optimizer_pilot/pilot_huginn_1+2x5+1_muon.yaml"
    folders = collections.Counter(str(path(n).parent) for n in registry.RUNS)
    assert folders == {"examples": 2, "examples/paper/llama/layouts": 18, "examples/paper/llama/initial_injection": 16,
                       "examples/paper/llama/timestep": 12, "examples/paper/qwen/layouts": 7,
                       "examples/paper/qwen/initial_injection": 19, "examples/paper/qwen/history_injection": 9,
                       "examples/paper/qwen/timestep": 12, "examples/paper/qwen/combinations": 27,
                       "examples/paper/optimizer_pilot": 12}
    index = REPO / registry.INDEX
    links = re.findall(r"^\| \[([^\]]+)\]\(([^)]+)\) \|", index.read_text(), flags=re.M)
    assert sorted(name for name, _ in links) == sorted(registry.RUNS)
    for name, target in links:
        assert (index.parent / target).resolve() == (REPO / path(name)).resolve() and (index.parent / target).is_file()


def test_generated_files_are_every_config_and_the_index():
    files = generated_files()
    assert set(files) == {example_path(n) for n in registry.RUNS} | {INDEX}
    assert all(isinstance(p, PurePosixPath) and p.suffix in (".yaml", ".md") for p in files)
    assert files[INDEX].startswith("# The paper's runs, one config each\n")
    assert all(f"[{n}](" in files[INDEX] for n in registry.RUNS)
