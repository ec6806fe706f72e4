"""The console an operator reads: an ETA on each step line, the progress bar not repeated after the
end-of-run summary, ``--print-config`` without training, no Transformer Engine / Apex warnings
on import (training, preprocessing), and a SLURM example whose documented command creates the
log folder SLURM writes to."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from megatron_loop.config import config_from_dict
from megatron_loop.training.metrics import MetricsLogger, format_train_line
from train_fixtures import env
from testpaths import REPO

WARNING = "Transformer Engine and Apex are not installed"  # megatron-core's, four times per import
RECORD = {"event": "train", "step": 10, "loss": 5.43214, "lr_muon": 3e-3, "lr_adamw": 3e-3, "grad_norm": 1.2345,
          "tokens_per_s": 12345.6, "mfu": 0.0123, "mem_gib": 0.451, "mem_peak_gib": 0.502, "step_time_s": 0.1049,
          "skipped_updates": 0}


def test_step_line_ends_with_the_eta():
    assert format_train_line(RECORD, 300, eta_s=3725.4).endswith("| 0.105 s/step | ETA 1:02:05")
    assert "ETA" not in format_train_line(RECORD, 300)


def test_eta_is_the_mean_step_time_of_this_run_times_the_steps_left(tmp_path, monkeypatch):
    import megatron_loop.training.metrics as M

    clock = iter([100.0, 130.0])  # logger created at t = 100 s, 10 steps logged at t = 130 s
    monkeypatch.setattr(M.time, "monotonic", lambda: next(clock))
    cfg = config_from_dict({"train": {"output_dir": str(tmp_path / "run")}, "logging": {"progress_bar": False}})
    logger = MetricsLogger(cfg, enabled=True, start_step=20, total_steps=50)
    assert logger.eta_s(30) == 3.0 * 20  # 3 s/step over the 10 steps of this run, 20 steps left
    logger.close()


def test_progress_bar_is_closed_before_the_summary(tmp_path, capsys, monkeypatch):
    cfg = config_from_dict({"train": {"output_dir": str(tmp_path / "run"), "seq_length": 32, "global_batch_size": 8,
                                      "micro_batch_size": 2}, "logging": {"progress_bar": True}})
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a bar is drawn on a terminal only (console.py)
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=2)
    logger.log({**RECORD, "step": 2, "loss": 3.0})
    logger.summary(2, 16, 12.0)
    logger.close()
    err = capsys.readouterr().err
    assert "train:" in err  # the bar was drawn
    tail = err[err.index("training finished at step 2/2"):]
    assert tail.rstrip().endswith(f"(plot: python tools/plot_metrics.py {tmp_path / 'run'})"), tail
    assert "train:" not in tail and "step/s" not in tail and "\r" not in tail  # no bar after the summary


def test_print_config_prints_the_resolved_config_and_trains_nothing(tmp_path):
    config = tmp_path / "c.yaml"  # no data needed: nothing is opened
    config.write_text(f"model: {{backbone: tiny-llama, core_layers: 2, train_loops: 2}}\n"
                      f"train: {{output_dir: {tmp_path / 'run'}}}\n")
    r = subprocess.run([sys.executable, str(REPO / "pretrain_loop.py"), "--config", str(config), "--print-config",
                        "--set", "train.lr=0.01"], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    printed = json.loads(r.stdout)
    assert printed["train"]["lr"] == 0.01 and printed["model"]["hidden_size"] == 64  # override + backbone preset
    assert printed["train"]["eval_loops"] == [1, 2, 4]  # defaults resolved, as training prints them
    assert not (tmp_path / "run").exists()


def test_no_transformer_engine_or_apex_warnings(tmp_path):
    """The imports of training (model, megatron-core's optimizer/distributed packages) and of
    preprocessing (megatron-core's indexed dataset) warned four times each before."""
    probe = ("import megatron_loop, megatron.core.optimizer, megatron.core.distributed\n"
             "from megatron_loop.model import build_model\n"
             "import megatron_loop.data.preprocess, megatron.core.datasets.indexed_dataset\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and WARNING not in r.stderr, r.stderr[-2000:]


def test_slurm_command_creates_the_log_folder_slurm_writes_to():
    sbatch = (REPO / "examples" / "slurm_pretrain.sbatch").read_text()
    (folder,) = re.findall(r"^#SBATCH --output=([^/\s]+)/", sbatch, flags=re.M)
    command = f"mkdir -p {folder} && sbatch examples/slurm_pretrain.sbatch"
    assert command in sbatch and command in (REPO / "README.md").read_text()
