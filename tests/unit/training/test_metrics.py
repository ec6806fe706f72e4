"""Metrics sinks: JSONL truncation on resume and its tolerant reader, wandb offline without an API key
(project and run names from the config), the tqdm bar on rank 0, nothing on other ranks."""

from __future__ import annotations

import json
import sys

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.training.metrics import MetricsLogger, read_records, truncate_after

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)


def _cfg(tmp_path, **logging):
    return config_from_dict({"train": {"output_dir": str(tmp_path / "run"), "seq_length": 32},
                             "logging": logging})


def _record(step, loss=1.0):
    return {"event": "train", "step": step, "loss": loss, "tokens_per_s": 100.0}


def test_resume_drops_records_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(_record(s)) for s in range(1, 6)] + ['{"event": "train", "st']  # torn by a crash
    path.write_text("\n".join(lines))
    truncate_after(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_one_tolerant_reader_serves_truncation_and_the_curves(tmp_path):
    """A line torn by a crash and lines that are JSON but not records are skipped by every reader
    of metrics.jsonl (truncation on resume, the training curves), not an error."""
    from megatron_loop.curves import read_run

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(_record(1)), "[1, 2]", "7", json.dumps({"event": "eval", "step": 2, "val_loss_r1": 3.0}),
             json.dumps(_record(2)), json.dumps(_record(3)), '{"event": "tr']
    path.write_text("\n".join(lines))
    assert [record["step"] for _, record in read_records(path)] == [1, 2, 2, 3]
    run = read_run(path)
    assert [r["step"] for r in run.train] == [1, 2, 3] and [r["step"] for r in run.evals] == [2]
    truncate_after(path, 2)
    assert path.read_text().splitlines() == [lines[0], lines[3], lines[4]]


def test_jsonl_and_progress_bar_on_rank_zero_only(tmp_path, capsys, monkeypatch):
    cfg = _cfg(tmp_path, progress_bar=True)
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=4)  # stderr is not a terminal: no bar
    logger.log(_record(1, 2.5))
    logger.close()
    err = capsys.readouterr().err
    assert "step 1/4 | loss 2.5000" in err and "loss=2.5000" not in err and "\r" not in err
    (tmp_path / "run" / "metrics.jsonl").unlink()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar, drawn through tqdm
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=4)
    logger.log(_record(1, 2.5))
    logger.message("hello")
    logger.close()
    err = capsys.readouterr().err
    assert "hello" in err and "loss=2.5000" in err and "1/4" in err
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["loss"] == 2.5
    other = MetricsLogger(_cfg(tmp_path / "r1"), enabled=False, start_step=0, total_steps=4)
    other.log(_record(1))
    other.close()
    assert not (tmp_path / "r1").exists()


def test_wandb_runs_offline_without_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _cfg(tmp_path, wandb_project="looplm-test", wandb_run_name="tiny", progress_bar=False)
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=2)
    run = logger._wandb
    assert run is not None and run.settings.mode == "offline"
    assert run.project == "looplm-test" and run.name == "tiny"
    logger.log(_record(1))
    logger.close()
    run_id = (tmp_path / "run" / "wandb_run_id").read_text()
    assert list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}"))
