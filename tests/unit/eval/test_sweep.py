"""``eval/sweep.py``: what the sweep checks and decides before a model is loaded (settings, device, task
folders, the loop limit, the held-out window length, a fractional --limit's few items); the sweeps over an
export: tests/integration/eval/."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.eval.sweep import (FALLBACK_SEQ_LENGTH, SweepSettings, check_device, check_loop_limit,
                                      check_task_folder, limit_warnings, resolve_seq_length)


@pytest.fixture
def prefix(tmp_path) -> str:
    for ext in (".bin", ".idx"):
        (tmp_path / f"v{ext}").write_bytes(b"")
    return str(tmp_path / "v")


@pytest.mark.parametrize("fields, error, message", [
    (dict(loops=[2, 1]), LoopConfigError, "--loops [2, 1]: expected distinct loop counts >= 1 in increasing order"),
    (dict(loops=[1], limit=1.5), LoopConfigError, "--limit 1.5: expected a number of items per task (an integer "
                                                  ">= 1) or a fraction of each task in (0, 1)"),
    (dict(loops=[1]), LoopConfigError, "--tasks none: nothing to evaluate; pass --valid-prefix P (an indexed prefix, "
                                       "P.bin/P.idx) for the held-out loss, or name tasks to run"),
    (dict(loops=[1], valid_prefix="PREFIX", seq_length=1), LoopConfigError, "--seq-length 1: expected an integer >= 2"),
    (dict(loops=[1], valid_prefix="PREFIX", batch_size=0), LoopConfigError, "--batch-size 0: expected an integer >= 1"),
])
def test_settings_refused_before_anything_loads(prefix, fields, error, message):
    fields = {k: prefix if v == "PREFIX" else v for k, v in fields.items()}
    with pytest.raises(error) as err:
        SweepSettings(**fields)
    assert str(err.value) == message


def test_a_missing_prefix_names_both_files(tmp_path):
    with pytest.raises(LoopDataError) as err:
        SweepSettings(loops=[1], valid_prefix=str(tmp_path / "p"))
    assert str(err.value) == (f"--valid-prefix {tmp_path / 'p'}: missing {tmp_path / 'p'}.bin and {tmp_path / 'p'}.idx; "
                              "expected P.bin and P.idx written by tools/preprocess_data.py")


def test_device_and_task_folder_checks(tmp_path):
    check_device("cpu")
    with pytest.raises(LoopConfigError, match=r"^--device tpu: not a device this tool runs on; expected cpu, cuda"):
        check_device("tpu")
    with pytest.raises(LoopConfigError, match=r"^--include-path .*none: not found; expected a folder of lm-eval"):
        check_task_folder(str(tmp_path / "none"))
    (tmp_path / "f").write_text("")
    with pytest.raises(LoopConfigError, match=r"^--include-path .*f: not a folder; "):
        check_task_folder(str(tmp_path / "f"))
    with pytest.raises(LoopConfigError, match=r"^--include-path .*: no \*\.yaml in it; "):
        check_task_folder(str(tmp_path))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "task.yaml").write_text("task: x\n")
    check_task_folder(str(tmp_path))  # found in a subfolder, as lm-eval finds it


def test_loop_limit_is_16_k_with_the_cost_in_words():
    config = {"model_type": "looplm", "train_loops": 4, "prelude_layers": 1, "core_layers": 2, "coda_layers": 1}
    check_loop_limit("hf", config, {"--loops": 64, "--exit-max-loops": None})
    with pytest.raises(LoopConfigError) as err:
        check_loop_limit("hf", config, {"--loops": 65})
    assert str(err.value) == ("--loops 65: r = 65 is 16 x the training loop count K = 4 of hf/config.json (each "
                              "forward costs 13 x one at r = K); expected r <= 16 K = 64, or pass --no-loop-limit to "
                              "run it anyway")
    check_loop_limit("hf", {"model_type": "llama"}, {"--loops": 10_000})  # a native export: r = 1 only, elsewhere


def test_the_window_length_comes_from_the_export_with_warnings(prefix):
    s = SweepSettings(loops=[1], valid_prefix=prefix)
    assert resolve_seq_length(s, "hf", {"train_seq_length": 128}) == [] and s.seq_length == 128
    s = SweepSettings(loops=[1], valid_prefix=prefix)
    assert resolve_seq_length(s, "hf", {}) == [
        f"warning: hf/config.json has no train_seq_length (exported before it was recorded): the held-out loss uses "
        f"windows of {FALLBACK_SEQ_LENGTH} tokens; pass --seq-length with the training train.seq_length"]
    assert s.seq_length == 2048
    s = SweepSettings(loops=[1], valid_prefix=prefix, seq_length=256)
    assert resolve_seq_length(s, "hf", {"train_seq_length": 128}) == [
        "warning: --seq-length 256 is longer than the 128 tokens the model was trained on (hf/config.json "
        "train_seq_length): the held-out loss then measures length extrapolation too"]
    assert s.seq_length == 256


def test_a_fraction_that_leaves_few_items_is_said(prefix):
    tasks = {"facts": SimpleNamespace(eval_docs=list(range(1000))), "big": SimpleNamespace(eval_docs=list(range(10**5)))}
    s = SweepSettings(loops=[1], valid_prefix=prefix, limit=0.001)
    assert limit_warnings(s, tasks) == [
        "warning: --limit 0.001 keeps 1 of the 1,000 items of lm-eval task 'facts': its score moves by 100 points per "
        "item; pass a larger --limit (or none) for a score to compare"]
    assert limit_warnings(SweepSettings(loops=[1], valid_prefix=prefix, limit=50), tasks) == []  # items, not a fraction
