"""The DeepSpeed JSON of a start is read and resolved once (``config/deepspeed.DeepSpeedSettings``) and that
one object is what the checks, the start-up statement and the engine get: a real tiny training start counts
the opens of the file and the calls of the reader and the resolution; ``build_engine`` takes nothing else."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from megatron_loop.config.deepspeed import CONFIG_DIR
from megatron_loop.optim import OptimizerSettings, build_engine
from train_fixtures import env, tiny_config
from testpaths import REPO, TRAIN_SCRIPTS


def test_one_start_reads_and_resolves_the_deepspeed_json_once(tmp_path):
    config = tiny_config(tmp_path, train={"max_steps": 2, "eval_interval": 0, "save_interval": 2})
    out = tmp_path / "counts.json"
    run = subprocess.run([sys.executable, str(TRAIN_SCRIPTS / "count_deepspeed_reads.py"), str(out),
                          "--config", str(config)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()  # it trained
    assert json.loads(out.read_text()) == {"opened": 1, "read_run_json": 1, "resolve_ds_config": 1,
                                           "read_ds_config": 0, "engine_given_the_start_settings": True}


@pytest.mark.parametrize("given", [str(CONFIG_DIR / "zero1.json"), CONFIG_DIR / "zero1.json",
                                   {"zero_optimization": {"stage": 0}}, None])
def test_build_engine_takes_only_the_settings_object(given):
    with pytest.raises(TypeError, match=r"^build_engine takes the DeepSpeed settings as one DeepSpeedSettings "
                                        r"\(read and resolved once: .*\), not (str|PosixPath|dict|NoneType)$"):
        build_engine(torch.nn.Linear(2, 2), OptimizerSettings(lr=1e-3), given, total_steps=1)
