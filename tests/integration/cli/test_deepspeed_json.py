"""``--dry-run`` reads the DeepSpeed JSON and checks it against the YAML with the function the
engine uses at launch (megatron_loop/config/deepspeed.py): every contradiction is one ``error:``
line naming the file, the key and which side decides, exit 2, nothing written; the report gives
the precision and who chose it, the data epochs (with a warning for heavy reuse) and eval_loops."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from data_fixtures import data_assets
from megatron_loop.plan import prefix_tokens
from megatron_loop.errors import LoopConfigError
from megatron_loop.config import deepspeed as D
from train_fixtures import env, tiny_config
from testpaths import REPO

ROOT = REPO
ZERO1 = json.loads((ROOT / "deepspeed_configs" / "zero1.json").read_text())

# JSON edit -> (YAML overrides, the message after "error: train.deepspeed_config='<json>': ")
CASES = {
    "batch": ({"train_batch_size": 64}, [],
              "train_batch_size=64 disagrees with micro 2 x accum 4 x data-parallel 1 (= global 8); the YAML's "
              "train.global_batch_size and train.micro_batch_size decide: set \"auto\" in the JSON"),
    "micro": ({"train_micro_batch_size_per_gpu": 4}, [],
              "train_micro_batch_size_per_gpu=4 disagrees with micro 2 x accum 4"),
    "optimizer": ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, [],
                  "sets 'optimizer'; expected no 'optimizer' block: the optimizer (Muon + AdamW) and the WSD "
                  "schedule come from the YAML's train.* settings"),
    "scheduler": ({"scheduler": {"type": "WarmupLR"}}, [], "sets 'scheduler'; expected no 'scheduler' block"),
    "clipping": ({"gradient_clipping": 0.5}, [],
                 "gradient_clipping=0.5 disagrees with train.grad_clip=1.0; train.grad_clip decides: set \"auto\" "
                 "in the JSON"),
    "stage4": ({"zero_optimization": {"stage": 4}}, [],
               "zero_optimization.stage=4; expected a ZeRO stage 0, 1, 2 or 3"),
    "offload": ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, [],
                "zero_optimization.offload_optimizer.device='cpu': offloading is not supported with the Muon "
                "optimizer; expected \"none\" or no offload block"),
    "fp16": ({"fp16": {"enabled": True}}, [],
             "fp16.enabled=true: fp16 training is not supported; expected it false or absent (train.precision "
             "chooses bf16 or fp32)"),
    "bf16_vs_fp32": ({"bf16": {"enabled": True}}, ["train.precision=fp32"],
                     "bf16.enabled=true disagrees with train.precision='fp32'; train.precision decides: set "
                     "bf16.enabled to \"auto\" in the JSON, or train.precision: auto to let the JSON decide"),
    "fp32_vs_bf16": ({"bf16": {"enabled": False}}, ["train.precision=bf16"],
                     "bf16.enabled=false disagrees with train.precision='bf16'"),
    "bf16_stage0": ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}, ["train.precision=auto"],
                    "bf16 needs ZeRO stage >= 1 (use deepspeed_configs/zero1.json)"),
}


def _dry_run(config: Path, *sets: str, cwd: Path, as_json: bool = False) -> subprocess.CompletedProcess:
    """``--dry-run`` (with ``as_json``: ``--json``, the report as one JSON line on stdout)."""
    args = [a for s in sets for a in ("--set", s)] + (["--json"] if as_json else [])
    return subprocess.run([sys.executable, str(ROOT / "pretrain_loop.py"), "--config", str(config), *args,
                           "--dry-run"], cwd=cwd, env=env(), capture_output=True, text=True, timeout=120)


def _json(tmp_path: Path, name: str, edit: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**ZERO1, **edit}))
    return path


def test_every_contradiction_of_the_json_is_one_error_line(tmp_path):
    config = tiny_config(tmp_path)  # micro 2, global 8, fp32, grad_clip 1.0
    runs = {name: (_json(tmp_path, name, edit), sets) for name, (edit, sets, _) in CASES.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(runs, pool.map(
            lambda v: _dry_run(config, f"train.deepspeed_config={v[0]}", *v[1], cwd=tmp_path), runs.values())))
    for name, r in results.items():
        expected = f"error: train.deepspeed_config='{runs[name][0]}': {CASES[name][2]}"
        assert r.returncode == 2 and r.stdout == "", (name, r.stderr[-1500:])
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(expected), (name, r.stderr)
    assert not (tmp_path / "run").exists()


def test_launch_uses_the_same_check(tmp_path):
    """Training stops on the same line before anything is written (no process group, no folder)."""
    config = tiny_config(tmp_path)
    ds = _json(tmp_path, "stage4", CASES["stage4"][0])
    r = subprocess.run([sys.executable, str(ROOT / "pretrain_loop.py"), "--config", str(config), "--set",
                        f"train.deepspeed_config={ds}"], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"error: train.deepspeed_config='{ds}': {CASES['stage4'][2]}"), r.stderr[-1500:]
    assert not (tmp_path / "run").exists()


def test_unknown_deepspeed_keys_and_matching_numbers_pass():
    run = dict(micro_batch_size=2, grad_accum=4, data_parallel_size=1, grad_clip=1.0)
    config = {**ZERO1, "data_types": {"grad_accum_dtype": "fp32"}, "train_batch_size": 8, "gradient_clipping": 1,
              "bf16": {"enabled": False}}
    resolved = D.resolve_ds_config(config, bf16=False, **run)
    assert resolved["data_types"] == {"grad_accum_dtype": "fp32"} and resolved["bf16"]["enabled"] is False
    assert D.precision_choice(config, None, cuda=True) == (False, "bf16.enabled of train.deepspeed_config")
    assert D.precision_choice(ZERO1, None, cuda=True) == (True, "auto: bf16 with CUDA, fp32 without")
    assert D.precision_choice(ZERO1, False, cuda=True) == (False, "train.precision")
    with pytest.raises(LoopConfigError, match="bf16.enabled=false disagrees with train.precision='bf16'"):
        D.resolve_ds_config(config, bf16=True, **run)


def test_report_names_precision_source_data_epochs_and_eval_loops(tmp_path):
    from megatron_loop.data.indexed import count_tokens

    assets = data_assets()
    tokens = count_tokens(assets.prefix)  # megatron-core's reading of the index
    assert prefix_tokens(assets.prefix) == tokens  # the dry run's, from the .bin size and the token width
    config = tiny_config(tmp_path)  # 10 steps x 8 sequences x 32 tokens
    ok = _dry_run(config, cwd=tmp_path, as_json=True)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    report = json.loads(ok.stdout)
    assert (report["precision"], report["precision_from"]) == ("fp32", "train.precision")
    assert report["data_epochs"] == {assets.prefix: pytest.approx(10 * 8 * 32 / tokens)}
    assert report["eval_loops"] == [1, 2, 4] and report["eval_interval"] == 5  # K/2, K, 2K with K = 2
    auto = json.loads(_dry_run(config, "train.precision=auto", cwd=tmp_path, as_json=True).stdout)
    assert auto["precision"] == "auto" and auto["precision_from"].startswith("train.precision auto and bf16.enabled")

    steps = 5 * tokens // (8 * 32) + 1  # more than 4 epochs: a warning line, still exit 0
    heavy = _dry_run(config, f"train.max_steps={steps}", cwd=tmp_path, as_json=True)
    report = json.loads(heavy.stdout)
    epochs = report["data_epochs"][assets.prefix]
    assert heavy.returncode == 0 and epochs > 4
    assert heavy.stderr.splitlines() == [
        f"warning: data.train_prefixes[0] '{assets.prefix}': the plan reads {epochs:,.1f} epochs of it; beyond "
        "about 4 epochs repeated data stops helping (Muennighoff et al., 2023): train on more data, or set "
        "train.train_tokens / train.max_steps lower"]
