"""HF export inputs and hygiene: the loop count and timestep grid checked
when an export is loaded (``from_pretrained`` and lm-eval's ``--model_args``), bad converter
arguments as one ``error:`` line with nothing written, and a tokenizer that loads from the export
without running the model's code and without install-specific keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_fixtures import REPO
from hf_fixtures import CLI_EXPORTED, hf_assets, offline_env

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)

LG_MODEL = "core_qwen_scalar_lg"  # loop gating, K = 3: the prefix grid applies
NUM_LOOPS_ERROR = (r"LoopLMConfig\.num_loops={}: expected an integer >= 1 \(the inference loop count r\), "
                   r"or None for the training loop count K")
PREFIX_ERROR = (r"LoopLMConfig\.timestep_grid='prefix' with num_loops=6: the prefix grid is the training grid of "
                r"train_loops=3 steps, so r must be <= 3; use timestep_grid='rescaled' to extrapolate")


@pytest.mark.parametrize("value,shown", [(0, "0"), (-1, "-1"), ("abc", "'abc'"), (2.5, "2.5"), (True, "True")])
def test_num_loops_is_checked_at_load(value, shown):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match=NUM_LOOPS_ERROR.format(shown)):
        AutoModelForCausalLM.from_pretrained(hf_assets().exports[LG_MODEL], trust_remote_code=True, num_loops=value)


def test_prefix_grid_beyond_k_is_refused_at_load_and_on_assignment():
    from transformers import AutoModelForCausalLM

    folder = hf_assets().exports[LG_MODEL]
    for kwargs in ({"num_loops": 6, "timestep_grid": "prefix"}, {"timestep_grid": "prefix", "num_loops": 6}):
        with pytest.raises(ValueError, match=PREFIX_ERROR):
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, num_loops=3, timestep_grid="prefix")
    assert model.config.num_loops == 3 and model.config.num_hidden_layers == 1 + 3 + 1
    with pytest.raises(ValueError, match=PREFIX_ERROR):
        model.config.num_loops = 6
    with pytest.raises(ValueError, match=NUM_LOOPS_ERROR.format("0")):
        model.config.num_loops = 0
    assert model.config.num_loops == 3  # a refused value leaves the model as it was


@pytest.mark.parametrize("model_args,error", [
    ("num_loops=abc", NUM_LOOPS_ERROR.format("'abc'")),  # lm-eval keeps a non-number as a string
    ("num_loops=2.5", NUM_LOOPS_ERROR.format("2.5")),    # ... and parses 2.5 as a float
    ("num_loops=-1", NUM_LOOPS_ERROR.format("-1")),
    ("num_loops=6,timestep_grid=prefix", PREFIX_ERROR),
])
def test_lm_eval_model_args_are_checked_at_load(model_args, error):
    """``lm_eval --model hf --model_args pretrained=...,num_loops=R`` builds HFLM from this string."""
    from lm_eval.models.huggingface import HFLM

    args = f"pretrained={hf_assets().exports[LG_MODEL]},trust_remote_code=True,{model_args}"
    with pytest.raises(ValueError, match=error):
        HFLM.create_from_arg_string(args, {"device": "cpu", "batch_size": 1})


def test_exported_tokenizer_loads_without_the_model_code():
    """tokenizer_config.json carries no install-specific keys, and AutoTokenizer reads the export
    without running modeling_looplm.py (trust_remote_code=False skips transformers' question about
    the model code it finds in config.json)."""
    from transformers import AutoTokenizer

    assets = hf_assets()
    reference = AutoTokenizer.from_pretrained(assets.tokenizer)
    text = "Clara and Brian swap their kites."
    for name in (CLI_EXPORTED, LG_MODEL, "nonloop_qwen"):  # --tokenizer, run config's data.tokenizer, native
        folder = assets.exports[name]
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert not {"is_local", "local_files_only"} & set(config), name
        before = {m for m in sys.modules if m.startswith("transformers_modules")}
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        assert {m for m in sys.modules if m.startswith("transformers_modules")} == before
        assert tok(text)["input_ids"] == reference(text)["input_ids"] and tok.eos_token_id == reference.eos_token_id
        readme = (folder / "README.md").read_text()
        assert "AutoTokenizer.from_pretrained(PATH" in readme and "AutoModelForCausalLM.from_pretrained(PATH" in readme
    # the README's line, in a process that never imported megatron_loop (whose filters hide the notice): with the
    # model's code trusted, AutoTokenizer reads config.json without a question and without the model-type notice,
    # and a prompt longer than the training length draws no false "indexing errors" warning
    folder = assets.exports[LG_MODEL]
    assert "AutoTokenizer.from_pretrained(PATH, trust_remote_code=True)" in (folder / "README.md").read_text()
    code = (f"from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained({str(folder)!r}, "
            "trust_remote_code=True); print(len(t('word ' * 600)['input_ids']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(), timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and int(out.stdout) > json.loads((folder / "config.json").read_text())["train_seq_length"]
    assert out.stderr == "", out.stderr


def _convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "convert_to_hf.py"), *args], capture_output=True,
                          text=True, env=offline_env(), timeout=300)


@pytest.mark.parametrize("extra,message", [
    (["--max-shard-size", "banana"],
     "error: --max-shard-size 'banana': expected a positive size such as 500MB, 2GB, 1GiB or a number of bytes"),
    (["--tokenizer", "{tmp}/no/such/tokenizer"],
     "error: --tokenizer {tmp}/no/such/tokenizer: no such folder; expected a tokenizer folder saved with "
     "save_pretrained (or a hub name such as meta-llama/Llama-3.1-8B)"),
])
def test_converter_arguments_are_one_error_line(tmp_path, extra, message):
    out = tmp_path / "hf"
    proc = _convert("--checkpoint", str(hf_assets().checkpoints["base_llama"]), "--output", str(out),
                    *[e.format(tmp=tmp_path) for e in extra])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message.format(tmp=tmp_path)]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


def test_run_config_tokenizer_missing_names_the_config(tmp_path):
    """A tokenizer path that moved since training: the error names the run config's key, before the
    checkpoint is consolidated, and nothing is written."""
    import shutil

    from megatron_loop.errors import LoopDataError
    from megatron_loop.export.convert import convert_checkpoint

    ckpt = tmp_path / "ckpt"
    shutil.copytree(hf_assets().checkpoints["base_llama"], ckpt)
    config = json.loads((ckpt / "looplm_config.json").read_text())
    config["data"]["tokenizer"] = str(tmp_path / "moved" / "tokenizer")
    (ckpt / "looplm_config.json").write_text(json.dumps(config))
    with pytest.raises(LoopDataError) as error:
        convert_checkpoint(ckpt, tmp_path / "hf")
    assert str(error.value) == (f"{ckpt / 'looplm_config.json'}: data.tokenizer='{tmp_path / 'moved' / 'tokenizer'}': "
                                "no such folder; expected a tokenizer folder saved with save_pretrained (or a hub "
                                "name such as meta-llama/Llama-3.1-8B)")
    assert not (tmp_path / "hf").exists()


def test_export_records_its_transformers_and_another_major_version_warns_once(monkeypatch):
    """config.json names the transformers version that wrote the export; loading it under a major
    version the modeling file is not tested with warns once, naming both versions; the tested major
    loads silently."""
    import types
    import warnings

    import transformers
    from transformers import AutoModelForCausalLM

    folder = hf_assets().exports[LG_MODEL]
    written = json.loads((folder / "config.json").read_text())["transformers_version"]
    assert written == transformers.__version__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        # the export's own modeling module (loaded from the folder), running under a pretend 6.1.0
        monkeypatch.setattr(sys.modules[type(model).__module__], "transformers",
                            types.SimpleNamespace(__version__="6.1.0"))
        for _ in range(2):
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ours = [str(w.message) for w in caught if "LoopLM export written with" in str(w.message)]
    assert ours == [f"LoopLM export written with transformers {written}, loaded under transformers 6.1.0: its "
                    "modeling file is tested with transformers 5.x only; check cached generation against "
                    "cache-free decoding before trusting its outputs"]
